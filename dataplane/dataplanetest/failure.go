package dataplanetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

// maxFailurePoints bounds the failure points tried: the changes below
// write far fewer entries or rules than this in any backend.
const maxFailurePoints = 1000

var errInjected = errors.New("dataplanetest: injected write failure")

// failedWrite returns the scenario that fails the n-th write of one call,
// for every n the call reaches, and checks that each ServicePort is left
// wholly as it was before the call or wholly as the call asked, never a
// mix; and that a Reconcile afterwards brings everything to the new state,
// as the sync loop's retry does. The call is an Apply of changes to
// before, or, with viaReconcile, a Reconcile with the complete new state.
func failedWrite(viaReconcile bool, start func() map[dataplane.ServicePortName]*dataplane.ServicePort,
	changes map[dataplane.ServicePortName]*dataplane.ServicePort) func(t *testing.T, newBackend func(t *testing.T) Backend) {
	return func(t *testing.T, newBackend func(t *testing.T) Backend) {
		before := start()
		after := merge(before, changes)
		for n, sp := range after {
			if sp == nil {
				delete(after, n)
			}
		}
		call := "Apply"
		if viaReconcile {
			call = "Reconcile"
		}

		for n := 1; n <= maxFailurePoints; n++ {
			b := newBackend(t)
			if b.FailWrite == nil {
				t.Skip("the harness cannot make a write fail (Backend.FailWrite is nil)")
			}
			r := newRunner(t, b)
			if err := r.reconcile(before); err != nil {
				t.Fatal(err)
			}
			r.expect("before the failing call", expected(values(before)...))

			b.FailWrite(n, errInjected)
			var err error
			if viaReconcile {
				err = b.Dataplane.Reconcile(after)
			} else {
				err = b.Dataplane.Apply(changes)
			}
			b.FailWrite(0, nil)
			if err == nil {
				if n == 1 {
					t.Fatalf("%s succeeded although its first write was made to fail: Backend.FailWrite does not reach the tables", call)
				}
				// Every earlier n failed the call: all failure points
				// are covered.
				r.expect(fmt.Sprintf("after %s without a failure", call), expected(values(after)...))
				t.Logf("%s failed at each of its first %d writes and left no ServicePort half-written", call, n-1)
				return
			}
			if !errors.Is(err, errInjected) {
				t.Fatalf("with write %d made to fail, %s failed with %v, which does not carry the injected failure", n, call, err)
			}
			got := r.served()
			for _, name := range sortedNames(merge(before, changes)) {
				keys := keysOf(before[name], after[name])
				now := got.only(keys)
				if diff(now, expected(before[name]).only(keys)) != "" && diff(now, expected(after[name]).only(keys)) != "" {
					t.Fatalf("write %d of %s failed (%v), and left %s half-written:\n"+
						"  against its state before the call:\n%s\n  against the state asked for:\n%s",
						n, call, err, name, diff(now, expected(before[name]).only(keys)), diff(now, expected(after[name]).only(keys)))
				}
			}
			// The sync loop's retry.
			if err := b.Dataplane.Reconcile(after); err != nil {
				t.Fatalf("Reconcile after write %d of %s failed: %v", n, call, err)
			}
			r.expect(fmt.Sprintf("after write %d of %s failed and a Reconcile", n, call), expected(values(after)...))
		}
		t.Fatalf("%s still fails with write %d made to fail: FailWrite(n) fails more than one write", call, maxFailurePoints)
	}
}

// beforeFailure is the state the failure scenarios start from.
func beforeFailure() map[dataplane.ServicePortName]*dataplane.ServicePort {
	web, api, db := name("web"), name("api"), name("db")
	return map[dataplane.ServicePortName]*dataplane.ServicePort{
		web: svc(web, clusterIP(webIP, pod1, pod2), local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod1))),
		api: svc(api, clusterIP(apiIP, pod3)),
		db:  svc(db, clusterIP(dbIP, pod4)),
	}
}

// changesOfEveryKind are many kinds of change at once: backends replaced
// (web), a delete (api), affinity, backends and a frontend added (db), a
// new ServicePort (cache).
func changesOfEveryKind() map[dataplane.ServicePortName]*dataplane.ServicePort {
	web, api, db, cache := name("web"), name("api"), name("db"), name("cache")
	return map[dataplane.ServicePortName]*dataplane.ServicePort{
		web: svc(web, clusterIP(webIP, pod2, pod3, pod5), local(dataplane.NodePort, webNode, list(pod2, pod3, pod5), list(pod2))),
		api: nil,
		db: sticky(time.Minute, db, clusterIP(dbIP, pod4, pod6),
			local(dataplane.LoadBalancer, webLB, list(pod4, pod6), list(pod6))),
		cache: svc(cache, clusterIP("10.96.0.4:6379/TCP", "10.244.3.1:6379")),
	}
}

// changeDroppingAFrontend replaces web's backends and drops its NodePort.
func changeDroppingAFrontend() map[dataplane.ServicePortName]*dataplane.ServicePort {
	web := name("web")
	return map[dataplane.ServicePortName]*dataplane.ServicePort{
		web: svc(web, clusterIP(webIP, pod2, pod3, pod5)),
	}
}

func values(m map[dataplane.ServicePortName]*dataplane.ServicePort) []*dataplane.ServicePort {
	var out []*dataplane.ServicePort
	for _, n := range sortedNames(m) {
		out = append(out, m[n])
	}
	return out
}

func merge(a, b map[dataplane.ServicePortName]*dataplane.ServicePort) map[dataplane.ServicePortName]*dataplane.ServicePort {
	out := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for n, sp := range a {
		out[n] = sp
	}
	for n, sp := range b {
		out[n] = sp
	}
	return out
}

// The refusal scenarios size the tables at refusalRoom entries. hog and
// small fit together; big does not fit beside them, only without hog.
const refusalRoom = 100

func hogSP() *dataplane.ServicePort { return svc(name("a-hog"), clusterIP(webIP, pods(30)...)) }
func smallSP() *dataplane.ServicePort {
	return svc(name("b-small"), clusterIP(apiIP, pod1, pod2))
}
func bigSP(n int) *dataplane.ServicePort { return svc(name("c-big"), clusterIP(dbIP, pods(n)...)) }

// pods returns n distinct backends.
func pods(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.245.%d.%d:8080", i/200, i%200+1)
	}
	return out
}

// refusalRunner returns a runner over a backend with refusalRoom entries,
// or skips when the backend cannot refuse.
func refusalRunner(t *testing.T, newBackend func(t *testing.T) Backend) (*runner, dataplane.Refuser) {
	b := newBackend(t)
	if b.WithRoom == nil {
		t.Skip("the harness cannot build a backend with small tables (Backend.WithRoom is nil)")
	}
	b = b.WithRoom(refusalRoom)
	ref, ok := b.Dataplane.(dataplane.Refuser)
	if !ok {
		t.Skip("the backend does not implement dataplane.Refuser")
	}
	return newRunner(t, b), ref
}

// expectRefused fails unless exactly names are refused, for lack of room.
func expectRefused(t *testing.T, when string, ref dataplane.Refuser, names ...dataplane.ServicePortName) {
	t.Helper()
	got := ref.Refused()
	for _, n := range names {
		r, ok := got[n]
		if !ok {
			t.Fatalf("%s: %s is not refused; Refused() = %v", when, n, got)
		}
		if r.Reason != dataplane.RefusedMapFull || r.Message == "" {
			t.Fatalf("%s: %s is refused as %+v, want Reason %s and a message saying what to do", when, n, r, dataplane.RefusedMapFull)
		}
	}
	if len(got) != len(names) {
		t.Fatalf("%s: Refused() = %v, want only %v", when, got, names)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func refusedUntilRoom(t *testing.T, newBackend func(t *testing.T) Backend) {
	r, ref := refusalRunner(t, newBackend)
	hog, small, big := hogSP(), smallSP(), bigSP(80)
	must(t, "Apply hog and small", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{hog.Name: hog, small.Name: small}))
	r.expect("after hog and small", expected(hog, small))
	expectRefused(t, "after hog and small", ref)

	// big does not fit: refused alone, and the call still succeeds.
	must(t, "Apply of a ServicePort that does not fit", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{big.Name: big}))
	r.expect("after big was refused", expected(hog, small))
	expectRefused(t, "after big was applied", ref, big.Name)

	// Nothing freed room: Reconcile keeps it refused, without failing.
	must(t, "Reconcile with a refused ServicePort", r.reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{
		hog.Name: hog, small.Name: small, big.Name: big}))
	r.expect("after Reconcile", expected(hog, small))
	expectRefused(t, "after Reconcile", ref, big.Name)

	// Deleting hog makes room: big is programmed without being asked again.
	must(t, "Apply nil for hog", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{hog.Name: nil}))
	r.expect("after hog's delete made room", expected(small, big))
	expectRefused(t, "after hog's delete made room", ref)
}

func refusedKeepsOld(t *testing.T, newBackend func(t *testing.T) Backend) {
	r, ref := refusalRunner(t, newBackend)
	hog, small, bigWas := hogSP(), smallSP(), bigSP(2)
	must(t, "Apply", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{hog.Name: hog, small.Name: small, bigWas.Name: bigWas}))
	r.expect("after the first Apply", expected(hog, small, bigWas))

	// big grows past the room: the update is refused, and big goes on
	// serving what it did (refused whole, like a failed write).
	must(t, "Apply of an update that does not fit", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{bigWas.Name: bigSP(80)}))
	r.expect("after big's update was refused", expected(hog, small, bigWas))
	expectRefused(t, "after big's update", ref, bigWas.Name)

	// A smaller update fits and is programmed.
	bigNow := bigSP(10)
	must(t, "Apply of an update that fits", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{bigNow.Name: bigNow}))
	r.expect("after big's update that fits", expected(hog, small, bigNow))
	expectRefused(t, "after big's update that fits", ref)
}

func refusedThenDeleted(t *testing.T, newBackend func(t *testing.T) Backend) {
	r, ref := refusalRunner(t, newBackend)
	hog, small, big := hogSP(), smallSP(), bigSP(80)
	must(t, "Apply", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{hog.Name: hog, small.Name: small}))
	must(t, "Apply big", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{big.Name: big}))
	expectRefused(t, "after big", ref, big.Name)

	must(t, "Apply nil for big", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{big.Name: nil}))
	expectRefused(t, "after big's delete", ref)
	// Room made later must not bring the deleted ServicePort back.
	must(t, "Apply nil for hog", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{hog.Name: nil}))
	r.expect("after hog's delete", expected(small))
	expectRefused(t, "after hog's delete", ref)
}
