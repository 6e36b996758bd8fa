package watcher

import (
	"slices"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
)

// writeSummary is what one sync handed to the dataplane, for the one info
// line that summarises each sync (runner.logSync).
type writeSummary struct {
	// services are the Services with a ServicePort written or deleted.
	services map[serviceName]bool
	// servicePorts and frontends count the ServicePorts written (deleted
	// ones included) and the frontends of those that were not deleted.
	servicePorts, deleted, frontends int
	// reconciled is set by a full Reconcile, which writes every Service:
	// it has no names to log, only counts.
	reconciled         bool
	reconciledServices int
}

// maxLoggedServices caps the names in one summary line: a full reconcile
// of a big cluster would otherwise print every Service.
const maxLoggedServices = 20

// add counts the ServicePorts of one dataplane call.
func (w *writeSummary) add(changes map[dataplane.ServicePortName]*dataplane.ServicePort) {
	if len(changes) == 0 {
		return
	}
	if w.services == nil {
		w.services = map[serviceName]bool{}
	}
	for name, sp := range changes {
		w.services[serviceName{Namespace: name.Namespace, Name: name.Name}] = true
		w.servicePorts++
		if sp == nil {
			w.deleted++
			continue
		}
		w.frontends += len(sp.Frontends)
	}
}

// addAll counts a full Reconcile of all.
func (w *writeSummary) addAll(all map[dataplane.ServicePortName]*dataplane.ServicePort) {
	w.reconciled = true
	services := map[serviceName]bool{}
	for name, sp := range all {
		services[serviceName{Namespace: name.Namespace, Name: name.Name}] = true
		w.servicePorts++
		w.frontends += len(sp.Frontends)
	}
	w.reconciledServices = len(services)
}

// merge adds o to w.
func (w *writeSummary) merge(o writeSummary) {
	for key := range o.services {
		if w.services == nil {
			w.services = map[serviceName]bool{}
		}
		w.services[key] = true
	}
	w.servicePorts += o.servicePorts
	w.deleted += o.deleted
	w.frontends += o.frontends
}

// fields are the summary's log fields.
func (w writeSummary) fields() []zap.Field {
	if w.reconciled {
		return []zap.Field{zap.Int("servicesReconciled", w.reconciledServices),
			zap.Int("servicePortsWritten", w.servicePorts), zap.Int("frontendsWritten", w.frontends)}
	}
	return append(w.nameFields(), zap.Int("servicePortsWritten", w.servicePorts),
		zap.Int("servicePortsDeleted", w.deleted), zap.Int("frontendsWritten", w.frontends))
}

// nameFields are the Services' count and names, sorted, at most
// maxLoggedServices of them.
func (w writeSummary) nameFields() []zap.Field {
	names := make([]string, 0, len(w.services))
	for key := range w.services {
		names = append(names, key.String())
	}
	slices.Sort(names)
	fields := []zap.Field{zap.Int("servicesChanged", len(names))}
	if len(names) > maxLoggedServices {
		names = names[:maxLoggedServices]
		fields = append(fields, zap.Bool("servicesTruncated", true))
	}
	return append(fields, zap.Strings("services", names))
}

// takeWritten returns what was handed to the dataplane since the last call.
func (s *syncer) takeWritten() writeSummary {
	w := s.written
	s.written = writeSummary{}
	return w
}

// changedServices is the summary of a change set's Services, for the
// error line of a sync that could not write them.
func changedServices(cs changeSet) writeSummary {
	w := writeSummary{services: make(map[serviceName]bool, len(cs.services))}
	for key := range cs.services {
		w.services[key] = true
	}
	return w
}
