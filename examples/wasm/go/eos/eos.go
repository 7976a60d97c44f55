// Package eos helps write eos-processor WebAssembly transforms in Go, interface eos-transform/2
// (docs/TRANSFORMS.md "WebAssembly transforms"): the interface's version and the module's
// contract (what eos_interface_version and eos_contract answer), the apply input read without
// reflection, and the result written as the interface's JSON.
//
// Go's encoding/json reads and writes through reflection, which cost most of a call inside
// WebAssembly (docs/BENCHMARKS.md "WebAssembly transforms"). Here the input is scanned once and
// every value kept as its raw JSON until the module asks for it, so a module pays for the
// members it reads, not for the whole event; and an output that passes the event on with a
// few members set (Output.With) leaves the event's value to the host instead of writing it
// back.
package eos

import (
	"encoding/binary"
	"errors"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/extism/go-pdk"
)

// InterfaceVersion is the interface this package implements; the host refuses to start a
// module that answers a version it does not run.
const InterfaceVersion = "eos-transform/2"

// DefaultOutput is the output --output-topic configures.
const DefaultOutput = "default"

// OutputVersion answers eos_interface_version.
func OutputVersion() {
	pdk.OutputString(InterfaceVersion)
}

// Contract is what a module declares in eos_contract: where its events keep their id, entity
// and time, and every output it writes to. The processor takes the locations from it and
// refuses to start when a flag says otherwise, or when a declared output has no topic.
type Contract struct {
	// EventID is where the event id is: "header:<name>", "key" or a JSON pointer ("/auth_id");
	// "" leaves it to --event-id.
	EventID string
	// Entity is where the entity is, in the same forms; "" leaves it to --entity.
	Entity string
	// OccurredAt is a JSON pointer to the event time (RFC 3339); "" leaves it to
	// --occurred-at.
	OccurredAt string
	// Outputs names every output the module writes to: DefaultOutput when it writes there,
	// and the others, each configured with --output NAME=TOPIC. Nil leaves them undeclared.
	Outputs []string
	// Reads names the members of an event's value the module reads: the host then hands it
	// only those, so a large event costs it nothing it does not use. Nil: the whole value.
	Reads []string
}

// OutputContract answers eos_contract with c.
func OutputContract(c Contract) {
	var w Writer
	w.Byte('{')
	comma := false
	for _, member := range [...]struct{ name, value string }{
		{"event_id", c.EventID}, {"entity", c.Entity}, {"occurred_at", c.OccurredAt},
	} {
		if member.value == "" {
			continue
		}
		if comma {
			w.Byte(',')
		}
		w.String(member.name)
		w.Byte(':')
		w.String(member.value)
		comma = true
	}
	for _, list := range [...]struct {
		name  string
		names []string
	}{{"outputs", c.Outputs}, {"reads", c.Reads}} {
		if list.names == nil {
			continue
		}
		if comma {
			w.Byte(',')
		}
		w.String(list.name)
		w.Text(`:[`)
		for i, name := range list.names {
			if i > 0 {
				w.Byte(',')
			}
			w.String(name)
		}
		w.Byte(']')
		comma = true
	}
	w.Byte('}')
	pdk.Output(w.Bytes())
}

// Input is what apply is called with: one new event and its entity's state.
type Input struct {
	// State is what the module answered as the entity's state last time, as raw JSON; "null"
	// before the entity's first event.
	State []byte
	Event Event
}

// Event is one new event. Its value is the record's JSON object as the host parsed and wrote
// it again (docs/TRANSFORMS.md "What a module is given").
type Event struct {
	// Value holds the event's members, each as raw JSON: those Contract.Reads names when the
	// module declared them, else all.
	Value Object
	ID    string
	// Entity is the event's entity, which its state belongs to.
	Entity string
	// OccurredAt is the event time in UTC (RFC 3339); "" when the event has none.
	OccurredAt string
	// Key is the record key as text; "" when the record has none.
	Key string
	// Headers holds the record's headers, each a JSON string (or null).
	Headers   Object
	Partition int32
	Offset    int64
}

//go:wasmimport extism:host/env input_length
func inputLength() uint64

//go:wasmimport extism:host/env input_load_u64
func inputLoadU64(offset uint64) uint64

//go:wasmimport extism:host/env input_load_u8
func inputLoadU8(offset uint64) uint32

// The current call's input, in a buffer kept between calls: what a call allocates, Go's
// garbage collector walks again later.
var input []byte

// ReadInput reads apply's input. Its raw values are slices of a buffer the next call's input
// takes: read them in this call (Unquote and the accessors copy what they answer).
func ReadInput() (Input, error) {
	length := int(inputLength())
	if cap(input) < length {
		input = make([]byte, length, length+length/2)
	}
	input = input[:length]
	i := 0
	// Eight bytes a call, the last few one by one: the host answers 0 for a load past the end.
	for ; i+8 <= length; i += 8 {
		binary.LittleEndian.PutUint64(input[i:], inputLoadU64(uint64(i)))
	}
	for ; i < length; i++ {
		input[i] = byte(inputLoadU8(uint64(i)))
	}
	return ParseInput(input)
}

// ParseInput reads an apply input from its bytes.
func ParseInput(data []byte) (Input, error) {
	var in Input
	top, err := ParseObject(data)
	if err != nil {
		return in, err
	}
	in.State = []byte("null")
	if state, ok := top.Get("state"); ok {
		in.State = state
	}
	raw, ok := top.Get("event")
	if !ok {
		return in, errors.New("the input has no event")
	}
	event, err := ParseObject(raw)
	if err != nil {
		return in, err
	}
	for _, member := range event {
		switch string(member.name) {
		case "value":
			in.Event.Value, err = ParseObject(member.Raw)
		case "event_id":
			in.Event.ID, err = Unquote(member.Raw)
		case "entity":
			in.Event.Entity, err = Unquote(member.Raw)
		case "occurred_at":
			in.Event.OccurredAt, err = optionalString(member.Raw)
		case "key":
			in.Event.Key, err = optionalString(member.Raw)
		case "headers":
			in.Event.Headers, err = ParseObject(member.Raw)
		case "partition":
			var n int64
			n, err = strconv.ParseInt(string(member.Raw), 10, 32)
			in.Event.Partition = int32(n)
		case "offset":
			in.Event.Offset, err = strconv.ParseInt(string(member.Raw), 10, 64)
		}
		if err != nil {
			return in, err
		}
	}
	return in, nil
}

func optionalString(raw []byte) (string, error) {
	if string(raw) == "null" {
		return "", nil
	}
	return Unquote(raw)
}

// Member is one member of a JSON object: its name and its value as raw JSON.
type Member struct {
	// The name as it came, without its quotes; its escapes decoded by Name.
	name []byte
	Raw  []byte
}

// NewMember is a member to write: its name and its value as raw JSON.
func NewMember(name string, raw []byte) Member {
	return Member{name: []byte(name), Raw: raw}
}

// Name answers the member's name, decoded.
func (m Member) Name() string {
	if text, err := Unquote(append(append([]byte{'"'}, m.name...), '"')); err == nil {
		return text
	}
	return string(m.name)
}

// Is answers whether the member's name is name (compared as it came: a name with an escape,
// which the host never writes for a plain name, is not).
func (m Member) Is(name string) bool {
	return string(m.name) == name
}

// Object is a JSON object's members, in the order they came.
type Object []Member

// ParseObject reads the members of the JSON object in raw, each value kept as its raw JSON.
func ParseObject(raw []byte) (Object, error) {
	s := scanner{data: raw}
	object, err := s.object()
	if err != nil {
		return nil, err
	}
	s.whitespace()
	if s.at != len(s.data) {
		return nil, s.fail("text after the object")
	}
	return object, nil
}

// Get answers the raw JSON of the member name, and whether there is one.
func (o Object) Get(name string) ([]byte, bool) {
	for _, member := range o {
		if member.Is(name) {
			return member.Raw, true
		}
	}
	return nil, false
}

// String answers the member name decoded, when it is there and a JSON string.
func (o Object) String(name string) (string, bool) {
	raw, ok := o.Get(name)
	if !ok || len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	text, err := Unquote(raw)
	return text, err == nil
}

// Unquote decodes the JSON string raw (with its quotes).
func Unquote(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", errors.New("not a JSON string")
	}
	body := raw[1 : len(raw)-1]
	escaped := false
	for _, b := range body {
		if b == '\\' {
			escaped = true
			break
		}
	}
	if !escaped {
		return string(body), nil
	}
	out := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		b := body[i]
		if b != '\\' {
			out = append(out, b)
			continue
		}
		i++
		if i >= len(body) {
			return "", errors.New("a JSON string ends in a backslash")
		}
		switch body[i] {
		case '"', '\\', '/':
			out = append(out, body[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, n := unicodeEscape(body[i+1:])
			if n == 0 {
				return "", errors.New("a JSON string has a bad \\u escape")
			}
			out = utf8.AppendRune(out, r)
			i += n
		default:
			return "", errors.New("a JSON string has an unknown escape")
		}
	}
	return string(out), nil
}

// unicodeEscape reads the hex digits after `\u` (and a low surrogate's `\uXXXX` after a high
// one): the rune, U+FFFD for an unpaired surrogate as encoding/json decodes it, and how many
// bytes it read; 0 when the digits are not there.
func unicodeEscape(text []byte) (rune, int) {
	first, ok := hex4(text)
	if !ok {
		return 0, 0
	}
	if first < 0xd800 || first > 0xdfff {
		return first, 4
	}
	if first < 0xdc00 && len(text) >= 10 && text[4] == '\\' && text[5] == 'u' {
		if second, ok := hex4(text[6:]); ok && second >= 0xdc00 && second <= 0xdfff {
			return 0x10000 + (first-0xd800)<<10 + (second - 0xdc00), 10
		}
	}
	return utf8.RuneError, 4
}

func hex4(text []byte) (rune, bool) {
	if len(text) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range text[:4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// scanner walks JSON the host wrote: it finds where each value ends, and checks no more of it
// than that.
type scanner struct {
	data []byte
	at   int
}

func (s *scanner) fail(what string) error {
	return errors.New("the input is not the interface's JSON: " + what + " at byte " +
		strconv.Itoa(s.at))
}

func (s *scanner) whitespace() {
	for s.at < len(s.data) {
		switch s.data[s.at] {
		case ' ', '\t', '\n', '\r':
			s.at++
		default:
			return
		}
	}
}

func (s *scanner) object() (Object, error) {
	s.whitespace()
	if s.at >= len(s.data) || s.data[s.at] != '{' {
		return nil, s.fail("no object")
	}
	s.at++
	var object Object
	s.whitespace()
	if s.at < len(s.data) && s.data[s.at] == '}' {
		s.at++
		return object, nil
	}
	for {
		s.whitespace()
		name, err := s.string()
		if err != nil {
			return nil, err
		}
		s.whitespace()
		if s.at >= len(s.data) || s.data[s.at] != ':' {
			return nil, s.fail("no colon")
		}
		s.at++
		value, err := s.value()
		if err != nil {
			return nil, err
		}
		object = append(object, Member{name: name[1 : len(name)-1], Raw: value})
		s.whitespace()
		if s.at < len(s.data) && s.data[s.at] == ',' {
			s.at++
			continue
		}
		if s.at < len(s.data) && s.data[s.at] == '}' {
			s.at++
			return object, nil
		}
		return nil, s.fail("no comma or closing brace")
	}
}

// string skips the string at the cursor and answers it with its quotes.
func (s *scanner) string() ([]byte, error) {
	if s.at >= len(s.data) || s.data[s.at] != '"' {
		return nil, s.fail("no string")
	}
	start := s.at
	s.at++
	for s.at < len(s.data) {
		switch s.data[s.at] {
		case '\\':
			s.at += 2
		case '"':
			s.at++
			return s.data[start:s.at], nil
		default:
			s.at++
		}
	}
	return nil, s.fail("an unterminated string")
}

// value skips the value at the cursor and answers its raw JSON.
func (s *scanner) value() ([]byte, error) {
	s.whitespace()
	if s.at >= len(s.data) {
		return nil, s.fail("no value")
	}
	start := s.at
	switch s.data[s.at] {
	case '"':
		return s.string()
	case '{', '[':
		depth := 0
		for s.at < len(s.data) {
			switch s.data[s.at] {
			case '"':
				if _, err := s.string(); err != nil {
					return nil, err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.at++
			if depth == 0 {
				return s.data[start:s.at], nil
			}
		}
		return nil, s.fail("an unterminated object or array")
	default:
		for s.at < len(s.data) {
			switch s.data[s.at] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return s.data[start:s.at], nil
			}
			s.at++
		}
		return s.data[start:s.at], nil
	}
}

// Writer appends JSON. Strings are escaped as Go's encoding/json escapes them, HTML characters
// included (see String), so that a module written with this package and one written with
// encoding/json answer the same bytes.
type Writer struct {
	buf []byte
}

// Bytes answers what was written.
func (w *Writer) Bytes() []byte {
	return w.buf
}

// Byte appends one byte of JSON's punctuation.
func (w *Writer) Byte(b byte) {
	w.buf = append(w.buf, b)
}

// Text appends text that is JSON already, as it is.
func (w *Writer) Text(text string) {
	w.buf = append(w.buf, text...)
}

// Int appends a number.
func (w *Writer) Int(n int64) {
	w.buf = strconv.AppendInt(w.buf, n, 10)
}

const hexDigits = "0123456789abcdef"

// String appends text as a JSON string: `"` and `\` escaped, \n, \r and \t by name, other
// control characters and <, >, & as \u00XX, U+2028 and U+2029 as \u2028 and \u2029, and bytes
// that are not UTF-8 as \ufffd.
func (w *Writer) String(text string) {
	w.buf = append(w.buf, '"')
	start := 0
	for i := 0; i < len(text); {
		b := text[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			w.buf = append(w.buf, text[start:i]...)
			switch b {
			case '"', '\\':
				w.buf = append(w.buf, '\\', b)
			case '\n':
				w.buf = append(w.buf, '\\', 'n')
			case '\r':
				w.buf = append(w.buf, '\\', 'r')
			case '\t':
				w.buf = append(w.buf, '\\', 't')
			default:
				w.buf = append(w.buf, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		if r == utf8.RuneError && size == 1 {
			w.buf = append(w.buf, text[start:i]...)
			w.buf = append(w.buf, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			w.buf = append(w.buf, text[start:i]...)
			w.buf = append(w.buf, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	w.buf = append(w.buf, text[start:]...)
	w.buf = append(w.buf, '"')
}

// Output is one record to write.
type Output struct {
	// Name is the output: DefaultOutput or a name configured with --output NAME=TOPIC.
	Name string
	// Key is the record key; nil keys it by the event's entity.
	Key *string
	// Value is the record's value as raw JSON; or, when it is nil,
	Value []byte
	// With is the members to set on the event's value, which then is the record's value
	// (event_value_with): the host builds it, so the module never writes the event again.
	With Object
	// Headers are headers of its own, written in the order of their names.
	Headers map[string]string
}

// The buffer results are written in, kept between calls.
var result Writer

// Apply answers apply with the entity's new state (raw JSON) and the outputs.
func Apply(state []byte, outputs ...Output) {
	w := &result
	w.buf = w.buf[:0]
	w.Text(`{"state":`)
	w.buf = append(w.buf, state...)
	if len(outputs) > 0 {
		w.Text(`,"outputs":[`)
		for i, output := range outputs {
			if i > 0 {
				w.Byte(',')
			}
			output.write(w)
		}
		w.Byte(']')
	}
	w.Byte('}')
	pdk.Output(w.Bytes())
}

func (o Output) write(w *Writer) {
	w.Text(`{"output":`)
	w.String(o.Name)
	if o.Key != nil {
		w.Text(`,"key":`)
		w.String(*o.Key)
	}
	if o.Value != nil {
		w.Text(`,"value":`)
		w.buf = append(w.buf, o.Value...)
	} else {
		w.Text(`,"event_value_with":{`)
		for i, member := range o.With {
			if i > 0 {
				w.Byte(',')
			}
			w.String(member.Name())
			w.Byte(':')
			w.buf = append(w.buf, member.Raw...)
		}
		w.Byte('}')
	}
	if len(o.Headers) > 0 {
		names := make([]string, 0, len(o.Headers))
		for name := range o.Headers {
			names = append(names, name)
		}
		sort.Strings(names)
		w.Text(`,"headers":{`)
		for i, name := range names {
			if i > 0 {
				w.Byte(',')
			}
			w.String(name)
			w.Byte(':')
			w.String(o.Headers[name])
		}
		w.Byte('}')
	}
	w.Byte('}')
}

// Refuse answers apply with a refusal: the event becomes a dead letter whose
// eos-dlq-transform-reason is code.
func Refuse(code, detail string) {
	w := &result
	w.buf = w.buf[:0]
	w.Text(`{"refusal":{"code":`)
	w.String(code)
	w.Text(`,"detail":`)
	w.String(detail)
	w.Text(`}}`)
	pdk.Output(w.Bytes())
}
