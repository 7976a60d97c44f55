// The host's share, for the benchmark (docs/BENCHMARKS.md "WebAssembly transforms"): every
// event passed on to the default output as it came, keyed by its entity, reading none of it
// (its contract reads no member, its output is the event's value with nothing set). What a run
// with this module costs beyond the native transform is what the processor and Extism cost a
// call, whatever the module does. It declares no outputs, so the benchmark's --output
// flagged=TOPIC, which the card modules write to, is not refused.

import * as eos from "./eos";

export function eos_interface_version(): i32 {
  eos.outputVersion();
  return 0;
}

export function eos_contract(): i32 {
  const contract = new eos.Contract();
  contract.reads = [];
  eos.outputContract(contract);
  return 0;
}

export function apply(): i32 {
  eos.outputText('{"state":null,"outputs":[{"output":"default","event_value_with":{}}]}');
  return 0;
}
