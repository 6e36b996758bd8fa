package realcluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/namedns"
)

// Traffic sends an HTTP GET to each of its URLs every interval from the
// cluster network (the control plane's namespace: a machine beside the
// nodes, as a client of a NodePort is), each on a new connection, and
// counts the requests that failed and those that were slow, until Stop.
type Traffic struct {
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu    sync.Mutex
	total Tally
	// sinceTake is what Take has not returned yet.
	sinceTake Tally
}

// Tally counts requests: how many were sent, and a line (time, URL,
// error or duration) for each that failed or answered slowly.
type Tally struct {
	Sent   int
	Failed []string
	Slow   []string
}

// requestTimeout is how long a request may go unanswered before it counts
// as failed: the client pod's (wget -T 10), so both clients judge alike. A
// lost SYN is sent again after 1 s and 3 s, within it; a request that
// needed that shows up as slow instead.
const requestTimeout = 10 * time.Second

// slowRequest is the duration from which an answered request is listed as
// slow: a healthy one takes milliseconds, and one whose SYN was dropped
// and sent again takes a second or more.
const slowRequest = time.Second

// StartTraffic starts requests to urls every interval.
func (c *Cluster) StartTraffic(urls []string, interval time.Duration) (*Traffic, error) {
	ns, err := netns.GetFromPath(namedns.Path(c.NetNS))
	if err != nil {
		return nil, fmt.Errorf("opening the cluster's network namespace: %w", err)
	}
	client := netnsClient(ns)
	ctx, cancel := context.WithCancel(context.Background())
	t := &Traffic{cancel: cancel}
	for _, u := range urls {
		t.done.Add(1)
		go func() {
			defer t.done.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				began := time.Now()
				err := get(ctx, client, u)
				if ctx.Err() != nil {
					return
				}
				t.record(u, began, time.Since(began), err)
			}
		}()
	}
	go func() {
		t.done.Wait()
		ns.Close()
	}()
	return t, nil
}

// WaitAnswer waits until each of urls has answered a GET with 200 OK from
// the cluster network, or timeout passes.
func (c *Cluster) WaitAnswer(ctx context.Context, urls []string, timeout time.Duration) error {
	ns, err := netns.GetFromPath(namedns.Path(c.NetNS))
	if err != nil {
		return fmt.Errorf("opening the cluster's network namespace: %w", err)
	}
	defer ns.Close()
	client := netnsClient(ns)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, u := range urls {
		for {
			err := get(ctx, client, u)
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s has not answered within %s: %v", u, timeout, err)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// netnsClient is an HTTP client whose connections are made in ns, each
// request on a new one.
func netnsClient(ns netns.NsHandle) *http.Client {
	return &http.Client{
		Timeout: requestTimeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(_ context.Context, _, address string) (net.Conn, error) {
				return cluster.DialInNetNS(ns, address)
			},
		},
	}
}

func get(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return nil
}

func (t *Traffic) record(url string, began time.Time, took time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tally := range []*Tally{&t.total, &t.sinceTake} {
		tally.Sent++
		switch {
		case err != nil:
			tally.Failed = append(tally.Failed, fmt.Sprintf("%s %s: %v", began.Format("15:04:05.000"), url, err))
		case took >= slowRequest:
			tally.Slow = append(tally.Slow, fmt.Sprintf("%s %s: %s", began.Format("15:04:05.000"), url, took.Round(time.Millisecond)))
		}
	}
}

// Take returns the tally since the last Take (or the start).
func (t *Traffic) Take() Tally {
	t.mu.Lock()
	defer t.mu.Unlock()
	tally := t.sinceTake
	t.sinceTake = Tally{}
	return tally
}

// Stop ends the requests and returns the tally of the whole run.
func (t *Traffic) Stop() Tally {
	t.cancel()
	t.done.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}
