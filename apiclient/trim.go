package apiclient

import (
	"bytes"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Trim says which labels and annotations of the Services and
// EndpointSlices the trimmed clients decode (see Clients.Trimmed); the
// others are skipped, as are the fields no part of kpr reads (see
// trimRules).
type Trim struct {
	ServiceLabels, ServiceAnnotations []string
	SliceLabels, SliceAnnotations     []string
}

// Trimmed returns clients like c whose protobuf decoder skips, in the
// encoded bytes, what the informer caches would drop right after
// decoding: managed fields, owner references, finalizers, the labels and
// annotations t does not list, a Service's selector and status conditions,
// and per endpoint the pod reference, hostname, zone and deprecated
// topology. At 10,000 Services as Helm, kubectl and the EndpointSlice
// controller write them, decoding all of that (about 12 KB of objects per
// Service and slice, in thousands of small allocations) only to drop it
// was most of the garbage of kpr's start-up, and so most of its
// collection work and of its peak memory. The caller still trims what it
// caches (JSON responses are decoded whole), so skipping here changes no
// cached value, only what is allocated on the way.
//
// Clients not built by New or ForConfig are returned as they are.
func (c *Clients) Trimmed(t Trim) (*Clients, error) {
	if c.cfg == nil {
		return c, nil
	}
	return forConfig(c.cfg, trimmingSerializer(t))
}

// trimRules turns t into the rules of each kind the decoder trims, and of
// their lists.
func trimRules(t Trim) map[string]*msgRule {
	meta := func(labels, annotations []string) *msgRule {
		return &msgRule{fields: map[protowire.Number]fieldRule{
			metaLabels: {keepKeys: labels},
			// The bookmark that ends a watch's initial events is an
			// object of the watched kind marked by this annotation:
			// without it the informer waits for the end forever.
			metaAnnotations:     {keepKeys: append(slices.Clone(annotations), metav1.InitialEventsAnnotationKey)},
			metaOwnerReferences: {drop: true},
			metaFinalizers:      {drop: true},
			metaManagedFields:   {drop: true},
		}}
	}
	service := &msgRule{fields: map[protowire.Number]fieldRule{
		objMetadata: {nested: meta(t.ServiceLabels, t.ServiceAnnotations)},
		serviceSpec: {nested: &msgRule{fields: map[protowire.Number]fieldRule{
			specSelector: {drop: true},
		}}},
		serviceStatus: {nested: &msgRule{fields: map[protowire.Number]fieldRule{
			statusConditions: {drop: true},
		}}},
	}}
	slice := &msgRule{fields: map[protowire.Number]fieldRule{
		objMetadata: {nested: meta(t.SliceLabels, t.SliceAnnotations)},
		sliceEndpoints: {nested: &msgRule{fields: map[protowire.Number]fieldRule{
			endpointHostname:           {drop: true},
			endpointTargetRef:          {drop: true},
			endpointDeprecatedTopology: {drop: true},
			endpointZone:               {drop: true},
		}}},
	}}
	list := func(item *msgRule) *msgRule {
		return &msgRule{fields: map[protowire.Number]fieldRule{listItems: {nested: item}}}
	}
	return map[string]*msgRule{
		"Service": service, "ServiceList": list(service),
		"EndpointSlice": slice, "EndpointSliceList": list(slice),
	}
}

// Field numbers of the Kubernetes protobuf messages the rules name
// (k8s.io/api and k8s.io/apimachinery generated.proto).
const (
	unknownTypeMeta  = 1 // runtime.Unknown
	unknownRaw       = 2
	typeMetaKind     = 2 // runtime.TypeMeta
	watchEventObject = 2 // metav1.WatchEvent
	rawExtensionRaw  = 1 // runtime.RawExtension

	objMetadata    = 1 // Service, EndpointSlice
	listItems      = 2 // ServiceList, EndpointSliceList
	serviceSpec    = 2
	serviceStatus  = 3
	sliceEndpoints = 2

	metaLabels          = 11 // metav1.ObjectMeta
	metaAnnotations     = 12
	metaOwnerReferences = 13
	metaFinalizers      = 14
	metaManagedFields   = 17

	specSelector     = 2 // v1.ServiceSpec
	statusConditions = 2 // v1.ServiceStatus

	endpointHostname           = 3 // discoveryv1.Endpoint
	endpointTargetRef          = 4
	endpointDeprecatedTopology = 5
	endpointZone               = 7

	mapEntryKey = 1 // the entries of a protobuf map
)

// msgRule says what of one message to keep: every field it does not name
// is copied as it is.
type msgRule struct {
	fields map[protowire.Number]fieldRule
}

// fieldRule is what to do with each occurrence of one field.
type fieldRule struct {
	// drop skips the field.
	drop bool
	// keepKeys, for a map field, are the keys of the entries kept; an
	// entry under any other key is skipped.
	keepKeys []string
	// nested trims the field as a message.
	nested *msgRule
	// object trims the field as an encoded Kubernetes object
	// (protobufPrefix and a runtime.Unknown), by the rule of its kind.
	object bool
}

func (r fieldRule) keeps(key []byte) bool {
	for _, k := range r.keepKeys {
		if string(key) == k {
			return true
		}
	}
	return false
}

// trimmingSerializer returns the codec factory's serializers with the
// protobuf one trimming by t.
func trimmingSerializer(t Trim) func(runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	// Each kind's rule, applied to the runtime.Unknown that holds it.
	rules := map[string]*msgRule{}
	for kind, object := range trimRules(t) {
		rules[kind] = &msgRule{fields: map[protowire.Number]fieldRule{unknownRaw: {nested: object}}}
	}
	return func(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
		infos := slices.Clone(ns.SupportedMediaTypes())
		for i := range infos {
			if infos[i].MediaType != runtime.ContentTypeProtobuf {
				continue
			}
			infos[i].Serializer = &trimmingDecoder{Serializer: infos[i].Serializer, kinds: rules}
			if infos[i].StreamSerializer != nil {
				// The watch decoder copies each event's object bytes
				// before it decodes them: trim them in the event already.
				stream := *infos[i].StreamSerializer
				stream.Serializer = &trimmingDecoder{Serializer: stream.Serializer, kinds: rules, event: watchEventRule}
				infos[i].StreamSerializer = &stream
			}
		}
		return negotiated{NegotiatedSerializer: ns, infos: infos}
	}
}

// negotiated is a NegotiatedSerializer with other serializers.
type negotiated struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n negotiated) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

// protobufPrefix starts every Kubernetes protobuf object: "k8s\0", then a
// runtime.Unknown holding the kind and the object's bytes.
var protobufPrefix = []byte("k8s\x00")

// watchEventRule trims the object of a watch event.
var watchEventRule = &msgRule{fields: map[protowire.Number]fieldRule{
	watchEventObject: {nested: &msgRule{fields: map[protowire.Number]fieldRule{
		rawExtensionRaw: {object: true},
	}}},
}}

// trimmingDecoder decodes objects of the kinds it has rules for (or, with
// event set, watch events) from a trimmed copy of their bytes; everything
// else, and encoding, is the Serializer's.
type trimmingDecoder struct {
	runtime.Serializer
	// kinds are the rules by kind, for the runtime.Unknown holding it.
	kinds map[string]*msgRule
	// event, if set, makes this the decoder of a watch stream's events
	// (metav1.WatchEvent, without prefix), and is their rule.
	event *msgRule
}

// buffers holds the trimmed copies between decodes: the protobuf decoder
// copies every string and byte field it keeps, so a copy is free again as
// soon as Decode returns.
var buffers = sync.Pool{New: func() any { return new([]byte) }}

func (d *trimmingDecoder) Decode(data []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if _, raw := into.(*runtime.Unknown); raw {
		return d.Serializer.Decode(data, gvk, into)
	}
	buf := buffers.Get().(*[]byte)
	defer buffers.Put(buf)
	var trimmed []byte
	var ok bool
	if _, event := into.(*metav1.WatchEvent); event && d.event != nil {
		trimmed, ok = d.trimMessage((*buf)[:0], data, d.event)
	} else {
		trimmed, ok = d.trimObject((*buf)[:0], data)
	}
	*buf = trimmed
	if !ok { // nothing to trim, or not what the rules expect: decode it whole, and let that report it
		return d.Serializer.Decode(data, gvk, into)
	}
	return d.Serializer.Decode(trimmed, gvk, into)
}

// trimObject appends the encoded Kubernetes object b to dst, trimmed by
// the rule of its kind; false if it has none or b is not well-formed.
func (d *trimmingDecoder) trimObject(dst, b []byte) ([]byte, bool) {
	if !bytes.HasPrefix(b, protobufPrefix) {
		return dst, false
	}
	unknown := b[len(protobufPrefix):]
	rule := d.kinds[unknownKind(unknown)]
	if rule == nil {
		return dst, false
	}
	return d.trimMessage(append(dst, protobufPrefix...), unknown, rule)
}

// unknownKind returns the kind in a runtime.Unknown's type meta, or "".
func unknownKind(b []byte) string {
	typeMeta, _ := fieldBytes(b, unknownTypeMeta)
	kind, _ := fieldBytes(typeMeta, typeMetaKind)
	return string(kind)
}

// fieldBytes returns the last occurrence of the bytes field num of the
// message b, as protobuf decoding would keep it.
func fieldBytes(b []byte, num protowire.Number) (value []byte, found bool) {
	for len(b) > 0 {
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return nil, false
		}
		valueLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
		if valueLen < 0 {
			return nil, false
		}
		if n == num && typ == protowire.BytesType {
			value, _ = protowire.ConsumeBytes(b[tagLen:])
			found = true
		}
		b = b[tagLen+valueLen:]
	}
	return value, found
}

// trimMessage appends the message b to dst, trimmed by rule; false if b is
// not well-formed.
func (d *trimmingDecoder) trimMessage(dst, b []byte, rule *msgRule) ([]byte, bool) {
	for len(b) > 0 {
		num, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return dst, false
		}
		valueLen := protowire.ConsumeFieldValue(num, typ, b[tagLen:])
		if valueLen < 0 {
			return dst, false
		}
		field := b[:tagLen+valueLen]
		b = b[tagLen+valueLen:]
		r, named := rule.fields[num]
		if !named || typ != protowire.BytesType {
			dst = append(dst, field...)
			continue
		}
		value, _ := protowire.ConsumeBytes(field[tagLen:])
		switch {
		case r.drop:
		case r.nested != nil || r.object:
			var ok bool
			if dst, ok = d.appendNested(dst, num, value, r); !ok {
				return dst, false
			}
		default: // a map entry
			if key, _ := fieldBytes(value, mapEntryKey); r.keeps(key) {
				dst = append(dst, field...)
			}
		}
	}
	return dst, true
}

// appendNested appends field num holding value trimmed by r (a message
// or an object; an object of a kind without rule is copied). The length goes before the message but is known only after it:
// room for value's length is kept (the trimmed one is no longer), and the
// message moved back if its length takes fewer bytes.
func (d *trimmingDecoder) appendNested(dst []byte, num protowire.Number, value []byte, r fieldRule) ([]byte, bool) {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	lenAt := len(dst)
	room := protowire.SizeVarint(uint64(len(value)))
	for range room {
		dst = append(dst, 0)
	}
	start := len(dst)
	var ok bool
	if r.object {
		if dst, ok = d.trimObject(dst, value); !ok {
			dst = append(dst[:start], value...)
		}
	} else if dst, ok = d.trimMessage(dst, value, r.nested); !ok {
		return dst, false
	}
	n := len(dst) - lenAt - room
	size := protowire.SizeVarint(uint64(n))
	protowire.AppendVarint(dst[lenAt:lenAt], uint64(n))
	if size < room {
		copy(dst[lenAt+size:], dst[lenAt+room:])
		dst = dst[:len(dst)-(room-size)]
	}
	return dst, true
}
