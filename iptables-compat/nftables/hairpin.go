package nftables

import (
	"maps"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// hairpinRefs counts, for each element of the hairpin sets (by its id),
// the rendered ServicePorts that hold it: two Services that select the
// same pods share their elements, so one is written when the first
// ServicePort comes and deleted when the last goes.
type hairpinRefs map[string]*hairpinRef

type hairpinRef struct {
	el element
	n  int
}

// count adds d for each hairpin element of r (nil: none).
func (h hairpinRefs) count(r *renderedPort, d int) {
	if r == nil {
		return
	}
	for _, pr := range r.rules {
		for _, e := range pr.hairpin {
			ref := h[e.id()]
			if ref == nil {
				ref = &hairpinRef{el: e}
				h[e.id()] = ref
			}
			ref.n += d
		}
	}
}

// apply adds the counts of delta to h, dropping the elements no
// ServicePort holds any more.
func (h hairpinRefs) apply(delta hairpinRefs) {
	for id, d := range delta {
		ref := h[id]
		if ref == nil {
			ref = &hairpinRef{el: d.el}
			h[id] = ref
		}
		ref.n += d.n
		if ref.n <= 0 {
			delete(h, id)
		}
	}
}

// elements are the elements h holds, in id order, so that every full
// write is the same transaction.
func (h hairpinRefs) elements() []element {
	out := make([]element, 0, len(h))
	for _, id := range slices.Sorted(maps.Keys(h)) {
		if h[id].n > 0 {
			out = append(out, h[id].el)
		}
	}
	return out
}

// byKey is what h holds in the hairpin set name, by key as nft lists it.
func (h hairpinRefs) byKey(name string) map[string]string {
	out := map[string]string{}
	for _, ref := range h {
		if ref.el.m == name && ref.n > 0 {
			out[strings.Join(ref.el.key, " . ")] = ""
		}
	}
	return out
}

// writeHairpinChanges writes what delta changes in h: an element that
// comes to be held is added, one no longer held deleted. Only the
// elements of the changed ServicePorts are looked at.
func writeHairpinChanges(tx *knftables.Transaction, h, delta hairpinRefs) {
	for _, id := range slices.Sorted(maps.Keys(delta)) {
		d := delta[id]
		before := 0
		if ref := h[id]; ref != nil {
			before = ref.n
		}
		switch after := before + d.n; {
		case before <= 0 && after > 0:
			tx.Add(d.el.object())
		case before > 0 && after <= 0:
			tx.Delete(d.el.object())
		}
	}
}
