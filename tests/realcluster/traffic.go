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
// counts the requests that failed, until Stop.
type Traffic struct {
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu     sync.Mutex
	sent   int
	failed []string
}

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
				err := get(ctx, client, u)
				if ctx.Err() != nil {
					return
				}
				t.record(u, err)
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
		Timeout: 2 * time.Second,
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

func (t *Traffic) record(url string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent++
	if err != nil {
		t.failed = append(t.failed, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), url, err))
	}
}

// Stop ends the requests and returns how many were sent and the failures.
func (t *Traffic) Stop() (sent int, failed []string) {
	t.cancel()
	t.done.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sent, t.failed
}
