package maps

import "github.com/cilium/ebpf"

// The two writes of carrying a pinned map over into a new one of another
// size or layout (loader/carry.go decides when and in which order). They
// copy raw entries: the loader compares the two maps' BTF layouts and hands
// in convert, which turns an old value into a new one (nil copies it as it
// is).

// CopyEntries writes keys and values into dst in order and returns how many
// it wrote; it stops at the first error (for an LRU map, full: the rest was
// evicted anyway).
func CopyEntries(dst *ebpf.Map, keys, values [][]byte, convert func([]byte) []byte) (int, error) {
	for i := range keys {
		v := values[i]
		if convert != nil {
			v = convert(v)
		}
		if err := dst.Put(keys[i], v); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

// CopyMissing copies the entries of src that dst does not have and returns
// how many: the entries the old programs wrote after the first copy. An
// entry dst already has is newer and stays.
func CopyMissing(src, dst *ebpf.Map, convert func([]byte) []byte) int {
	k, v := make([]byte, src.KeySize()), make([]byte, src.ValueSize())
	copied := 0
	for it := src.Iterate(); it.Next(k, v); {
		nv := v
		if convert != nil {
			nv = convert(v)
		}
		if dst.Update(k, nv, ebpf.UpdateNoExist) == nil {
			copied++
		}
	}
	return copied
}
