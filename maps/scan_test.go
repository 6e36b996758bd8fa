package maps

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// churn writes Services 10.97.0.x between the steps of a scan: new ones,
// changed backend sets (grown, shrunk, replaced) and deletions, with and
// without affinity, so that every table is written while it is scanned.
type churn struct {
	t   *testing.T
	lb  *LB
	rnd *rand.Rand
	n   int
}

func (c *churn) svc(i int) Service {
	s := svcFor(fmt.Sprintf("10.97.0.%d", i%250+1), 80)
	for j := range c.rnd.IntN(4) {
		s.Backends = append(s.Backends, svcFor("10.245.0.1", 80, fmt.Sprintf("10.245.%d.%d:8080", i%250, j+c.rnd.IntN(3))).Backends...)
	}
	if i%3 == 0 {
		s.AffinityTimeout = 30
	}
	return s
}

func (c *churn) step() {
	c.t.Helper()
	c.n++
	i := c.rnd.IntN(40)
	var err error
	if c.rnd.IntN(4) == 0 {
		err = c.lb.Delete(c.svc(i).VIPKey)
	} else {
		s := c.svc(i)
		// Distinct backends only: a Service lists each backend once.
		seen := map[string]bool{}
		kept := s.Backends[:0]
		for _, b := range s.Backends {
			if !seen[b.String()] {
				seen[b.String()] = true
				kept = append(kept, b)
			}
		}
		s.Backends = kept
		err = c.lb.Upsert(s)
	}
	if err != nil {
		c.t.Fatalf("churn write %d: %v", c.n, err)
	}
}

// scanFixture is an LB holding Service a (10.96.0.1, with affinity) and
// 40 churned Services, over in-memory maps that skip the lookup-safety
// check (the tests damage the maps on purpose).
func scanFixture(t *testing.T, seed uint64) (*fakeMaps, *LB, Service, *churn) {
	f := newFakeMaps(t, 10000, 10000, 10000)
	f.services.check, f.backends.check, f.revNat.check = nil, nil, nil
	lb := f.lb()
	a := svcFor("10.96.0.1", 80, "10.244.0.2:8080", "10.244.0.3:8080")
	a.AffinityTimeout = 10
	if err := lb.Upsert(a); err != nil {
		t.Fatal(err)
	}
	c := &churn{t: t, lb: lb, rnd: rand.New(rand.NewPCG(seed, 1))}
	for range 60 {
		c.step()
	}
	if ok, err := lb.InSync(); !ok || err != nil {
		t.Fatalf("fixture not in sync before the test: %v", err)
	}
	return f, lb, a, c
}

// runScan steps a scan of lb through to the end, with writes between the
// steps, and returns its verdict.
func runScan(t *testing.T, lb *LB, c *churn, stepSize int) bool {
	t.Helper()
	s := lb.StartDriftScan()
	for steps := 0; ; steps++ {
		done, inSync, err := s.Step(stepSize)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return inSync
		}
		if steps > 100000 {
			t.Fatal("scan does not end")
		}
		c.step()
		c.step()
	}
}

// Writes between the steps of a scan are not drift: the scan must not
// report what kpr itself wrote meanwhile, whichever table and whether the
// scan had already passed the entries or not.
func TestDriftScanIgnoresWritesBetweenSteps(t *testing.T) {
	for seed := range uint64(30) {
		_, lb, _, c := scanFixture(t, seed)
		for _, stepSize := range []int{1, 3, 50} {
			if !runScan(t, lb, c, stepSize) {
				t.Fatalf("seed %d, step size %d: drift reported though only the LB wrote the maps", seed, stepSize)
			}
			if ok, err := lb.InSync(); !ok || err != nil {
				t.Fatalf("seed %d: the churn itself left the maps out of sync (%v): the test is wrong", seed, err)
			}
		}
	}
}

// Drift made before a scan is found however the scan's steps interleave
// with writes to other Services: entries missing from the maps (found only
// by counting), extra ones, and changed ones, in every table.
func TestDriftScanNoticesDriftDespiteWritesBetweenSteps(t *testing.T) {
	for name, drift := range driftKinds {
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(10) {
				for _, stepSize := range []int{1, 7, 10000} {
					f, lb, a, c := scanFixture(t, seed)
					drift(f, a)
					if runScan(t, lb, c, stepSize) {
						t.Fatalf("seed %d, step size %d: drift not noticed", seed, stepSize)
					}
				}
			}
		})
	}
}

func TestDriftScanAbandonedByResync(t *testing.T) {
	_, lb, _, _ := scanFixture(t, 1)
	s := lb.StartDriftScan()
	if done, _, err := s.Step(1); done || err != nil {
		t.Fatalf("first step of 1 entry: done=%v err=%v", done, err)
	}
	if err := lb.Resync(); err != nil {
		t.Fatal(err)
	}
	if done, inSync, err := s.Step(1000000); !done || inSync || err != nil {
		t.Fatalf("after a Resync: done=%v inSync=%v err=%v, want done and not in sync", done, inSync, err)
	}
	if lb.touched.services != nil || lb.scan != nil {
		t.Fatal("an abandoned scan still records writes")
	}
}
