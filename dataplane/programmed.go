package dataplane

import "maps"

// AfterApply is what a backend that keeps the ServicePorts it programmed
// programs once Apply(changes) is done: programmed with changes over it,
// a nil ServicePort deleting its name; and the names that changed.
// Deleting a name that was never programmed changes nothing. programmed
// is not modified.
func AfterApply(programmed, changes map[ServicePortName]*ServicePort) (map[ServicePortName]*ServicePort, []ServicePortName) {
	next := maps.Clone(programmed)
	if next == nil {
		next = map[ServicePortName]*ServicePort{}
	}
	var changed []ServicePortName
	for n, sp := range changes {
		if sp == nil {
			if _, ok := next[n]; !ok {
				continue
			}
			delete(next, n)
		} else {
			next[n] = sp
		}
		changed = append(changed, n)
	}
	return next, changed
}

// AfterReconcile is what such a backend programs once Reconcile(all) is
// done: all without its nil entries; and the names a full write touches,
// every one of all and every one programmed before (to delete).
func AfterReconcile(programmed, all map[ServicePortName]*ServicePort) (map[ServicePortName]*ServicePort, []ServicePortName) {
	next := make(map[ServicePortName]*ServicePort, len(all))
	var changed []ServicePortName
	for n, sp := range all {
		if sp != nil {
			next[n] = sp
			changed = append(changed, n)
		}
	}
	for n := range programmed {
		if _, ok := next[n]; !ok {
			changed = append(changed, n)
		}
	}
	return next, changed
}
