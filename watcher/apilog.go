package watcher

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// apiLogInterval is how often logAPIState looks at the connection state:
// it changes with time alone (a call that has waited too long), so it is
// polled, which costs a lock per second.
const apiLogInterval = time.Second

// logAPIState logs each change of the API connection's state, so that the
// log shows an outage or a stuck watch, and its end, without `kpr status`:
// an outage once a call fails or has waited apiWaitLimit, stuck watches
// after watchSilenceLimit without a word from the API server.
func logAPIState(ctx context.Context, c *connState, log *zap.Logger, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var was APIStatus
	was.Connected = true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := c.status()
		switch {
		case was.Connected && !st.Connected:
			log.Warn("The API server does not answer kpr's list and watch calls; the dataplane keeps the state it has, "+
				"and changes made in the API meanwhile reach it once the calls succeed again. Check the API server and the path to it "+
				"(kpr status shows since when)", zap.Timep("since", st.DisconnectedSince), zap.String("error", st.LastError))
		case !was.Connected && st.Connected:
			log.Info("The API server answers kpr's calls again", zap.Timep("lastHeard", st.LastHeard))
		case !was.Stuck && st.Stuck:
			log.Warn("The API server's watches have delivered nothing, not even a bookmark, for "+watchSilenceLimit.String()+
				"; changes made in the API do not reach the dataplane. If it lasts, restart kpr: it lists everything again and keeps the dataplane meanwhile",
				zap.Timep("lastHeard", st.LastHeard))
		case was.Stuck && !st.Stuck && st.Connected:
			log.Info("The API server's watches deliver again", zap.Timep("lastHeard", st.LastHeard))
		}
		was = st
	}
}
