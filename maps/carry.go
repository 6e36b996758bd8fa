package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

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

// CopyInnerMaps writes keys into dst, a map of maps, each pointing at the
// inner map whose id ids holds (a map of maps reads as the ids of its
// inner maps, and is written with file descriptors of them), and returns
// how many it wrote. An inner map gone since its id was read is skipped:
// its entry is gone from the old map too. It stops at the first error.
func CopyInnerMaps(dst *ebpf.Map, keys, ids [][]byte) (int, error) {
	n := 0
	for i := range keys {
		if len(ids[i]) != 4 {
			return n, fmt.Errorf("an inner map id of %d bytes, want 4", len(ids[i]))
		}
		id := ebpf.MapID(binary.NativeEndian.Uint32(ids[i]))
		inner, err := ebpf.NewMapFromID(id)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("open inner map %d: %w", id, err)
		}
		err = dst.Put(keys[i], inner)
		inner.Close()
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
