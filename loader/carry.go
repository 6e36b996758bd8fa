package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/maps"
)

// Carrying pinned maps over.
//
// A pinned map cannot change its size or layout in place. When the pinned
// map and the spec disagree (new --map-size-* values, or a kpr version whose
// map has other fields), Load carries the contents over instead of asking
// for `kpr cleanup`, in an order that leaves no moment in which a program
// sees an empty map:
//
//  1. create the new map, unpinned, and copy every entry into it;
//  2. load the new programs against it (MapReplacements);
//  3. swap them into the pinned links (BPF_LINK_UPDATE): until then the
//     old programs keep serving from the old map, which they reference by
//     fd, not by pin;
//  4. copy again what the old programs added to maps they write themselves
//     (the LRU maps) between 1 and 3;
//  5. pin the new map under a temporary name and rename it over the old
//     pin, so the pin is never missing.
//
// A map whose key layout changed, or whose value layout changed in a way no
// field-by-field copy can carry, is recreated empty with a warning that says
// what is lost. A map is never shrunk below the entries it holds.

// carryOver is one pinned map being replaced.
type carryOver struct {
	name     string
	pin      string
	old, new *ebpf.Map
	// convert turns an old value into a new one; nil copies it as it is.
	convert func([]byte) []byte
	// carried is false when the contents could not be carried at all.
	carried bool
	entries int
}

// carryOvers are the pinned maps Load replaces, by map name.
type carryOvers map[string]*carryOver

// sizeFlags names the flag that sizes each map, for error messages.
var sizeFlags = map[string]string{
	bpf.KprMapKprServices:      "--map-size-services",
	bpf.KprMapKprAffinityMatch: "--map-size-services",
	bpf.KprMapKprBackends:      "--map-size-backends",
	bpf.KprMapKprRevNat:        "--map-size-revnat",
	bpf.KprMapKprMaglev:        "--map-size-revnat",
	bpf.KprMapKprSockRev:       "--map-size-sockrev",
	bpf.KprMapKprAffinity:      "--map-size-affinity",
	bpf.KprMapKprSrcRanges:     "--map-size-src-ranges",
}

// lostWithout says what traffic loses while a recreated map is empty.
var lostWithout = map[string]string{
	bpf.KprMapKprServices:      "Services are not translated until the first sync rewrites them from the API",
	bpf.KprMapKprBackends:      "Services are not translated until the first sync rewrites them from the API",
	bpf.KprMapKprRevNat:        "UDP replies and getpeername() show backend addresses until the first sync rewrites them",
	bpf.KprMapKprAffinityMatch: "session affinity restarts until the first sync rewrites it",
	bpf.KprMapKprSockRev:       "UDP sockets connected before now see replies from the backend's address, not the Service's",
	bpf.KprMapKprAffinity:      "clients with session affinity may be sent to another backend once",
	bpf.KprMapKprFrags:         "fragmented datagrams in flight lose their later fragments once",
	bpf.KprMapKprMaglev:        "new flows to Maglev frontends pick backends at random until the first reconcile rewrites their tables",
}

// prepareCarryOver finds every pinned map under bpfRoot that spec no longer
// matches and builds its replacement (step 1). Nothing is changed on disk or
// in the kernel's links; on error everything it made is closed.
func prepareCarryOver(spec *ebpf.CollectionSpec, bpfRoot string, log *zap.Logger) (carryOvers, error) {
	out := carryOvers{}
	for _, name := range pinnedIn(spec) {
		c, err := prepareOne(spec.Maps[name], filepath.Join(bpfRoot, name), log)
		if err != nil {
			out.close()
			return nil, err
		}
		if c != nil {
			out[name] = c
		}
	}
	return out, nil
}

func prepareOne(ms *ebpf.MapSpec, pin string, log *zap.Logger) (*carryOver, error) {
	old, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // created and pinned by the collection
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w (remove it with `kpr cleanup`)", pin, err)
	}
	diffs := specDiffs(old, ms)
	convert, layoutDiffs, carriable := compareLayout(old, ms)
	diffs = append(diffs, layoutDiffs...)
	if len(diffs) == 0 {
		old.Close()
		return nil, nil // adopted as it is
	}
	c := &carryOver{name: ms.Name, pin: pin, old: old, convert: convert, carried: carriable}

	var keys, vals [][]byte
	if carriable {
		it := old.Iterate()
		for {
			// Fresh buffers each time: the iterator fills them in place.
			k, v := make([]byte, old.KeySize()), make([]byte, old.ValueSize())
			if !it.Next(k, v) {
				break
			}
			keys, vals = append(keys, k), append(vals, v)
		}
		if err := it.Err(); err != nil {
			// The LRU maps are written by the programs while this runs:
			// a hash iteration can then abort. What was read is carried;
			// the second pass after the swap picks up the rest.
			if !isLRU(old.Type()) || !errors.Is(err, ebpf.ErrIterationAborted) {
				old.Close()
				return nil, fmt.Errorf("read pinned map %s to carry it over: %w", pin, err)
			}
			log.Warn("iterating a pinned LRU map aborted while carrying it over; carrying what was read",
				zap.String("map", ms.Name), zap.Int("entries", len(keys)), zap.Error(err))
		}
		if len(keys) > int(ms.MaxEntries) && !isLRU(old.Type()) {
			old.Close()
			return nil, fmt.Errorf("pinned map %s holds %d entries, more than the %d requested: kpr does not shrink a map below what it holds, "+
				"as that would drop Services; ask for at least %d (%s), or remove Services first",
				pin, len(keys), ms.MaxEntries, len(keys), sizeFlags[ms.Name])
		}
		if len(keys) > int(ms.MaxEntries) {
			// An LRU map is a cache the programs fill on their own (and
			// keep full on a busy node); shrinking it keeps the entries
			// that fit, as the kernel's own eviction would.
			log.Warn("shrinking an LRU map below the entries it holds: entries past the new size are evicted",
				zap.String("map", ms.Name), zap.Int("entries", len(keys)), zap.Uint32("maxEntries", ms.MaxEntries))
		}
	}

	fresh := ms.Copy()
	fresh.Pinning = ebpf.PinNone
	if c.new, err = ebpf.NewMap(fresh); err != nil {
		old.Close()
		return nil, fmt.Errorf("create map %s to carry %s over: %w", ms.Name, pin, err)
	}
	if isMapOfMaps(old.Type()) {
		// Read, an entry's value is the inner map's id; written, the
		// kernel takes a file descriptor of it.
		c.entries, err = maps.CopyInnerMaps(c.new, keys, vals)
	} else {
		c.entries, err = maps.CopyEntries(c.new, keys, vals, convert)
	}
	if err != nil && !isLRU(old.Type()) { // a full LRU map: the rest was evicted
		c.close()
		return nil, fmt.Errorf("copy entries of %s into its new map: %w", pin, err)
	}
	if carriable {
		log.Info("carrying a pinned map over into a new one: its spec changed",
			zap.String("map", ms.Name), zap.Strings("changes", diffs), zap.Int("entries", c.entries),
			zap.Bool("fieldByField", convert != nil))
	} else {
		lost := 0
		k, v := make([]byte, old.KeySize()), make([]byte, old.ValueSize())
		for it := old.Iterate(); it.Next(k, v); {
			lost++
		}
		log.Warn("pinned map's layout changed in a way its entries cannot be carried over: recreating it empty",
			zap.String("map", ms.Name), zap.Strings("changes", diffs), zap.Int("entriesLost", lost),
			zap.String("effect", lostWithout[ms.Name]))
	}
	return c, nil
}

// replacements are the new maps, for CollectionOptions.MapReplacements.
func (cs carryOvers) replacements() map[string]*ebpf.Map {
	if len(cs) == 0 {
		return nil
	}
	out := make(map[string]*ebpf.Map, len(cs))
	for name, c := range cs {
		out[name] = c.new
	}
	return out
}

// finish runs steps 4 and 5, once the links run the new programs.
func (cs carryOvers) finish(log *zap.Logger) error {
	names := make([]string, 0, len(cs))
	for name := range cs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := cs[name]
		if c.carried && isLRU(c.old.Type()) {
			// Entries the old programs wrote since the copy; an entry
			// the new programs wrote since the swap is newer and wins.
			late := maps.CopyMissing(c.old, c.new, c.convert)
			log.Debug("copied entries written during the swap", zap.String("map", name), zap.Int("entries", late))
		}
		tmp := carryPin(c.pin)
		_ = os.Remove(tmp) // left behind by an interrupted carry-over
		if err := c.new.Pin(tmp); err != nil {
			return fmt.Errorf("pin the carried-over map %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, c.pin); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("replace pin %s with the carried-over map: %w", c.pin, err)
		}
		log.Info("pinned map replaced by its carried-over copy", zap.String("map", name), zap.String("pin", c.pin))
	}
	return nil
}

// close drops this process's handles; pinned and linked maps live on.
func (cs carryOvers) close() {
	for _, c := range cs {
		c.close()
	}
}

func (c *carryOver) close() {
	c.old.Close()
	if c.new != nil {
		c.new.Close()
	}
}

// carryPin is where a carried-over map is pinned before it is renamed over
// pin (bpffs names cannot hold a dot). One left behind by an interrupted
// carry-over is replaced by the next, or removed by Cleanup.
func carryPin(pin string) string { return pin + "_carry" }

func isLRU(t ebpf.MapType) bool { return t == ebpf.LRUHash || t == ebpf.LRUCPUHash }

func isMapOfMaps(t ebpf.MapType) bool { return t == ebpf.HashOfMaps || t == ebpf.ArrayOfMaps }

// specDiffs lists how old differs from ms in what the kernel knows.
func specDiffs(old *ebpf.Map, ms *ebpf.MapSpec) []string {
	var d []string
	if old.Type() != ms.Type {
		d = append(d, fmt.Sprintf("type %s → %s", old.Type(), ms.Type))
	}
	if old.KeySize() != ms.KeySize {
		d = append(d, fmt.Sprintf("key size %d → %d", old.KeySize(), ms.KeySize))
	}
	if old.ValueSize() != ms.ValueSize {
		d = append(d, fmt.Sprintf("value size %d → %d", old.ValueSize(), ms.ValueSize))
	}
	if old.MaxEntries() != ms.MaxEntries {
		d = append(d, fmt.Sprintf("max_entries %d → %d", old.MaxEntries(), ms.MaxEntries))
	}
	if old.Flags() != ms.Flags {
		d = append(d, fmt.Sprintf("flags %#x → %#x", old.Flags(), ms.Flags))
	}
	return d
}

// compareLayout compares the key and value types of the pinned map, as its
// BTF describes them, with the spec's. carriable is false when the entries
// cannot be carried: another map type, or another key layout (a key with
// a field more or less would be a different key). A value whose fields
// changed is carried field by field, by name: fields both layouts have are
// copied, new fields start as zero. Without BTF on the pinned map only the
// sizes can be compared.
func compareLayout(old *ebpf.Map, ms *ebpf.MapSpec) (convert func([]byte) []byte, diffs []string, carriable bool) {
	if old.Type() != ms.Type {
		return nil, nil, false
	}
	oldBTF := pinnedBTF(old)
	oldKey, oldVal := typeIn(oldBTF, ms.Key), typeIn(oldBTF, ms.Value)
	if oldKey != nil {
		if a, b := layout(oldKey), layout(ms.Key); a != b {
			return nil, []string{fmt.Sprintf("key layout %s → %s", a, b)}, false
		}
	} else if old.KeySize() != ms.KeySize {
		return nil, nil, false
	}
	if oldVal == nil {
		return nil, nil, old.ValueSize() == ms.ValueSize
	}
	if a, b := layout(oldVal), layout(ms.Value); a != b {
		conv, dropped, ok := fieldCopier(oldVal, ms.Value, int(old.ValueSize()), int(ms.ValueSize))
		d := fmt.Sprintf("value layout %s → %s", a, b)
		if len(dropped) > 0 {
			d += " (dropped: " + strings.Join(dropped, ", ") + ")"
		}
		return conv, []string{d}, ok
	}
	return nil, nil, old.ValueSize() == ms.ValueSize
}

// pinnedBTF returns the BTF the pinned map was created with, or nil.
func pinnedBTF(m *ebpf.Map) *btf.Spec {
	info, err := m.Info()
	if err != nil {
		return nil
	}
	id, ok := info.BTFID()
	if !ok {
		return nil
	}
	h, err := btf.NewHandleFromID(id)
	if err != nil {
		return nil
	}
	defer h.Close()
	spec, err := h.Spec(nil)
	if err != nil {
		return nil
	}
	return spec
}

// typeIn finds the type called like t in spec: the old version of t.
func typeIn(spec *btf.Spec, t btf.Type) btf.Type {
	if spec == nil || t == nil || t.TypeName() == "" {
		return nil
	}
	found, err := spec.AnyTypeByName(t.TypeName())
	if err != nil {
		return nil
	}
	return found
}

// layout describes a type's memory layout: sizes, offsets and field names,
// without the names of the types themselves.
func layout(t btf.Type) string {
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Int:
		return fmt.Sprintf("%s%d", v.Encoding, v.Size*8)
	case *btf.Enum:
		return fmt.Sprintf("enum%d", v.Size*8)
	case *btf.Array:
		return fmt.Sprintf("[%d]%s", v.Nelems, layout(v.Type))
	case *btf.Struct:
		return membersLayout("{", v.Size, v.Members)
	case *btf.Union:
		return membersLayout("union{", v.Size, v.Members)
	case *btf.Pointer:
		return "ptr"
	default:
		return fmt.Sprintf("%T", v)
	}
}

func membersLayout(open string, size uint32, ms []btf.Member) string {
	var b strings.Builder
	b.WriteString(open)
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s@%d:%s", m.Name, m.Offset.Bytes(), layout(m.Type))
		if m.BitfieldSize != 0 {
			fmt.Fprintf(&b, ":%d", m.BitfieldSize)
		}
	}
	fmt.Fprintf(&b, "}%d", size)
	return b.String()
}

// fieldCopier builds a value conversion from struct oldT to struct newT
// that copies every field both have with the same name and layout. It
// refuses (ok false) when either is not a struct, a field is a bitfield,
// or the two share no field at all.
func fieldCopier(oldT, newT btf.Type, oldSize, newSize int) (conv func([]byte) []byte, dropped []string, ok bool) {
	oldS, ok1 := btf.UnderlyingType(oldT).(*btf.Struct)
	newS, ok2 := btf.UnderlyingType(newT).(*btf.Struct)
	if !ok1 || !ok2 {
		return nil, nil, false
	}
	type span struct{ from, to, n int }
	var spans []span
	oldBy := map[string]btf.Member{}
	for _, m := range oldS.Members {
		if m.BitfieldSize != 0 || m.Name == "" {
			return nil, nil, false
		}
		oldBy[m.Name] = m
	}
	kept := map[string]bool{}
	for _, m := range newS.Members {
		if m.BitfieldSize != 0 {
			return nil, nil, false
		}
		om, found := oldBy[m.Name]
		if !found || layout(om.Type) != layout(m.Type) {
			continue // new, or changed: starts as zero
		}
		n, err := btf.Sizeof(m.Type)
		if err != nil {
			return nil, nil, false
		}
		spans = append(spans, span{int(om.Offset.Bytes()), int(m.Offset.Bytes()), n})
		kept[m.Name] = true
	}
	for _, m := range oldS.Members {
		if !kept[m.Name] {
			dropped = append(dropped, m.Name)
		}
	}
	if len(spans) == 0 {
		return nil, dropped, false
	}
	return func(old []byte) []byte {
		out := make([]byte, newSize)
		if len(old) != oldSize {
			return out
		}
		for _, s := range spans {
			copy(out[s.to:s.to+s.n], old[s.from:s.from+s.n])
		}
		return out
	}, dropped, true
}
