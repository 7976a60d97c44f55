// A transform that misbehaves on purpose, for the host's tests (docs/TRANSFORMS.md
// "Determinism and limits"): every event's value goes to the default output as it came, except
// an event whose value has "do": "memory.fill", which clears a 64 MiB buffer for ever (each pass
// is one bulk-memory instruction, one unit of fuel whatever its length, so only the wall-clock
// limit ends it), and one with "do": "panic", which panics with a message of its own (the dead
// letter must carry it).
package main

import (
	"encoding/json"
	"fmt"

	"github.com/extism/go-pdk"
)

type input struct {
	Event struct {
		Value   map[string]json.RawMessage `json:"value"`
		EventID string                     `json:"event_id"`
	} `json:"event"`
}

type output struct {
	Output string `json:"output"`
	Value  any    `json:"value"`
}

type result struct {
	State   any      `json:"state"`
	Outputs []output `json:"outputs"`
}

// Kept in a global so the compiler cannot drop the clearing as a dead store.
var buffer []byte

//go:wasmexport eos_interface_version
func eosInterfaceVersion() int32 {
	pdk.OutputString("eos-transform/1")
	return 0
}

//go:wasmexport apply
func apply() int32 {
	var in input
	if err := json.Unmarshal(pdk.Input(), &in); err != nil {
		pdk.SetError(fmt.Errorf("input does not decode: %w", err))
		return 1
	}
	var do string
	_ = json.Unmarshal(in.Event.Value["do"], &do)
	switch do {
	case "memory.fill":
		buffer = make([]byte, 64<<20)
		for {
			// clear compiles to the runtime's memclrNoHeapPointers: one memory.fill.
			clear(buffer)
		}
	case "panic":
		panic(fmt.Sprintf("event %s asked for a panic", in.Event.EventID))
	}
	if err := pdk.OutputJSON(result{Outputs: []output{{Output: "default", Value: in.Event.Value}}}); err != nil {
		pdk.SetError(err)
		return 1
	}
	return 0
}

func main() {}
