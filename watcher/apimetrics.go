package watcher

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The API connection as metrics, read from connState when scraped, so that
// an alert needs no `kpr status`: kpr_api_connected is 0 while a call
// fails or waits, and time() - kpr_api_last_heard_timestamp_seconds grows
// past a few minutes only when the watches deliver nothing, not even
// their once-a-minute bookmarks. kube-proxy has neither; its /healthz
// stays 200 while its watches are stuck, and so does kpr's (see
// docs/operations.md).
func registerAPIMetrics(reg prometheus.Registerer, c *connState) error {
	for _, col := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "kpr",
			Name:      "api_connected",
			Help:      "1 while the informers' list and watch calls reach the API server, 0 while one fails or has waited for it for more than 3 s",
		}, func() float64 {
			if c.status().Connected {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "kpr",
			Name:      "api_last_heard_timestamp_seconds",
			Help:      "When the API server last sent kpr anything (a list, a watch opened, an event or a bookmark); 0 before the first",
		}, func() float64 {
			if h := c.status().LastHeard; h != nil {
				return float64(h.UnixNano()) / 1e9
			}
			return 0
		}),
	} {
		if err := reg.Register(col); err != nil {
			return fmt.Errorf("register the API connection metrics (give each Watcher its own metrics.Metrics): %w", err)
		}
	}
	return nil
}
