// Helps write eos-processor WebAssembly transforms in AssemblyScript, interface eos-transform/2
// (docs/TRANSFORMS.md "WebAssembly transforms"), as examples/wasm/go/eos does in Go: the
// interface's version and the module's contract (what eos_interface_version and eos_contract
// answer), the apply input read as bytes, and the result written as the interface's JSON.
//
// What a call costs inside WebAssembly is mostly its allocations, which the garbage collector
// then walks (docs/BENCHMARKS.md "WebAssembly transforms"). So the input is loaded into one
// buffer kept from call to call and scanned in place, a member's name is compared as bytes and
// its value decoded only when the module asks for it, and the result is written as UTF-8 into
// another kept buffer rather than built as strings. An output that passes the event on with a
// few members set (Output.withNames) leaves the event's value to the host instead of writing
// it back.

import {
  alloc,
  input_length,
  input_load_u64,
  input_load_u8,
  output_set,
  store_u64,
  store_u8,
} from "@extism/as-pdk/lib/env";

export const INTERFACE_VERSION = "eos-transform/2";
// The output --output-topic configures.
export const DEFAULT_OUTPUT = "default";

// ---- the call's input and output buffers ----------------------------------------------------

// The input of the current call, in a buffer kept between calls (grown when an input is
// larger).
let input = new Uint8Array(4096);
// What the current call answers, in a buffer kept between calls.
let out = new Uint8Array(4096);
let outLength: i32 = 0;

function loadInput(): i32 {
  const length = i32(input_length());
  if (length > input.length) input = new Uint8Array(length + (length >> 1));
  const base = input.dataStart;
  let i = 0;
  for (; i + 8 <= length; i += 8) store<u64>(base + i, input_load_u64(i));
  for (; i < length; i++) store<u8>(base + i, input_load_u8(i));
  return length;
}

function reserve(bytes: i32): void {
  if (outLength + bytes <= out.length) return;
  const grown = new Uint8Array((outLength + bytes) * 2);
  memory.copy(grown.dataStart, out.dataStart, outLength);
  out = grown;
}

function put(byte: i32): void {
  reserve(1);
  store<u8>(out.dataStart + outLength, u8(byte));
  outLength++;
}

// Appends `text` as UTF-8.
function putText(text: string): void {
  reserve(text.length * 3);
  for (let i = 0; i < text.length; i++) {
    let c = text.charCodeAt(i);
    if (c < 0x80) {
      store<u8>(out.dataStart + outLength++, u8(c));
      continue;
    }
    if (c >= 0xd800 && c < 0xdc00 && i + 1 < text.length) {
      const low = text.charCodeAt(i + 1);
      if (low >= 0xdc00 && low < 0xe000) {
        c = 0x10000 + ((c - 0xd800) << 10) + (low - 0xdc00);
        i++;
        reserve(4);
        store<u8>(out.dataStart + outLength++, u8(0xf0 | (c >> 18)));
        store<u8>(out.dataStart + outLength++, u8(0x80 | ((c >> 12) & 0x3f)));
        store<u8>(out.dataStart + outLength++, u8(0x80 | ((c >> 6) & 0x3f)));
        store<u8>(out.dataStart + outLength++, u8(0x80 | (c & 0x3f)));
        continue;
      }
    }
    if (c < 0x800) {
      store<u8>(out.dataStart + outLength++, u8(0xc0 | (c >> 6)));
    } else {
      store<u8>(out.dataStart + outLength++, u8(0xe0 | (c >> 12)));
      store<u8>(out.dataStart + outLength++, u8(0x80 | ((c >> 6) & 0x3f)));
    }
    store<u8>(out.dataStart + outLength++, u8(0x80 | (c & 0x3f)));
  }
}

const HEX = "0123456789abcdef";

// Appends `text` as a JSON string, escaped as examples/wasm/go/eos's Writer.String escapes
// it: `"` and `\`, \n, \r and \t by name, other control characters and <, >, & as \u00XX,
// U+2028 and U+2029 as \u2028 and \u2029.
function putString(text: string): void {
  put(0x22);
  let from = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x20 && c != 0x22 && c != 0x5c && c != 0x3c && c != 0x3e && c != 0x26) {
      if (c != 0x2028 && c != 0x2029) continue;
    }
    putText(text.substring(from, i));
    from = i + 1;
    if (c == 0x22) putText('\\"');
    else if (c == 0x5c) putText("\\\\");
    else if (c == 0x0a) putText("\\n");
    else if (c == 0x0d) putText("\\r");
    else if (c == 0x09) putText("\\t");
    else {
      putText("\\u");
      put(HEX.charCodeAt((c >> 12) & 15));
      put(HEX.charCodeAt((c >> 8) & 15));
      put(HEX.charCodeAt((c >> 4) & 15));
      put(HEX.charCodeAt(c & 15));
    }
  }
  putText(from == 0 ? text : text.substring(from));
  put(0x22);
}

// Makes what was written the call's output.
function send(): void {
  const offset = alloc(u64(outLength));
  const base = out.dataStart;
  let i = 0;
  for (; i + 8 <= outLength; i += 8) store_u64(offset + u64(i), load<u64>(base + i));
  for (; i < outLength; i++) store_u8(offset + u64(i), load<u8>(base + i));
  output_set(offset, u64(outLength));
  outLength = 0;
}

// Answers the call with `text` (UTF-8).
export function outputText(text: string): void {
  outLength = 0;
  putText(text);
  send();
}

// Answers eos_interface_version.
export function outputVersion(): void {
  outputText(INTERFACE_VERSION);
}

// What a module declares in eos_contract: where its events keep their id, entity and time
// ("header:<name>", "key" or a JSON pointer; "" leaves it to the flag), every output it writes
// to (DEFAULT_OUTPUT among them when it writes there; null leaves them undeclared), and the
// members of an event's value it reads (the host then hands it only those; null: all).
export class Contract {
  eventId: string = "";
  entity: string = "";
  occurredAt: string = "";
  outputs: string[] | null = null;
  reads: string[] | null = null;
}

// Answers eos_contract with `contract`.
export function outputContract(contract: Contract): void {
  outLength = 0;
  put(0x7b);
  let comma = false;
  const names = ["event_id", "entity", "occurred_at"];
  const places = [contract.eventId, contract.entity, contract.occurredAt];
  for (let i = 0; i < 3; i++) {
    if (places[i].length == 0) continue;
    if (comma) put(0x2c);
    putString(names[i]);
    put(0x3a);
    putString(places[i]);
    comma = true;
  }
  const lists = ["outputs", "reads"];
  for (let i = 0; i < 2; i++) {
    const list = i == 0 ? contract.outputs : contract.reads;
    if (list === null) continue;
    if (comma) put(0x2c);
    putString(lists[i]);
    putText(":[");
    for (let j = 0; j < list.length; j++) {
      if (j > 0) put(0x2c);
      putString(list[j]);
    }
    put(0x5d);
    comma = true;
  }
  put(0x7d);
  send();
}

// ---- reading --------------------------------------------------------------------------------

// One JSON value of the current call's input, as its range of bytes: read it before the next
// call, whose input takes the buffer.
export class Json {
  constructor(
    public start: i32,
    public end: i32,
  ) {}

  // Its raw JSON as text.
  text(): string {
    return String.UTF8.decodeUnsafe(input.dataStart + this.start, this.end - this.start);
  }

  isNull(): bool {
    return this.end - this.start == 4 && load<u8>(input.dataStart + this.start) == 0x6e;
  }

  isString(): bool {
    return this.end > this.start && load<u8>(input.dataStart + this.start) == 0x22;
  }

  // A JSON string, decoded.
  string(): string {
    return decode(this.start, this.end);
  }
}

function byteAt(at: i32): i32 {
  return load<u8>(input.dataStart + at);
}

// The JSON string between `start` and `end` (its quotes included), decoded.
function decode(start: i32, end: i32): string {
  let from = start + 1;
  const last = end - 1;
  let i = from;
  while (i < last && byteAt(i) != 0x5c) i++;
  if (i == last) return String.UTF8.decodeUnsafe(input.dataStart + from, last - from);
  let text = "";
  while (i < last) {
    if (byteAt(i) != 0x5c) {
      i++;
      continue;
    }
    text += String.UTF8.decodeUnsafe(input.dataStart + from, i - from);
    const e = byteAt(i + 1);
    i += 2;
    if (e == 0x75) {
      let unit = 0;
      for (let j = i; j < i + 4; j++) {
        const c = byteAt(j);
        unit = (unit << 4) | (c <= 0x39 ? c - 0x30 : (c | 0x20) - 0x61 + 10);
      }
      text += String.fromCharCode(unit);
      i += 4;
    } else if (e == 0x6e) text += "\n";
    else if (e == 0x74) text += "\t";
    else if (e == 0x72) text += "\r";
    else if (e == 0x62) text += "\b";
    else if (e == 0x66) text += "\f";
    else text += String.fromCharCode(e);
    from = i;
  }
  return text + String.UTF8.decodeUnsafe(input.dataStart + from, last - from);
}

// A JSON object's members, in the order they came, as ranges of the input: for each, the
// name's start and end (quotes included) and the value's.
export class Members {
  ranges: i32[] = [];

  get length(): i32 {
    return this.ranges.length >> 2;
  }

  // Whether member `i`'s name is `name`, compared as bytes (a name with an escape, which the
  // host never writes for a plain name, never matches).
  nameIs(i: i32, name: string): bool {
    const start = this.ranges[i << 2] + 1;
    const end = this.ranges[(i << 2) + 1] - 1;
    if (end - start != String.UTF8.byteLength(name)) return false;
    for (let j = 0; j < name.length; j++) {
      if (name.charCodeAt(j) >= 0x80) {
        return decode(start - 1, end + 1) == name;
      }
      if (byteAt(start + j) != name.charCodeAt(j)) return false;
    }
    return true;
  }

  // Member `i`'s name, decoded.
  name(i: i32): string {
    return decode(this.ranges[i << 2], this.ranges[(i << 2) + 1]);
  }

  // Member `i`'s value.
  value(i: i32): Json {
    return new Json(this.ranges[(i << 2) + 2], this.ranges[(i << 2) + 3]);
  }

  // The member `name`, or null.
  get(name: string): Json | null {
    for (let i = 0; i < this.length; i++) {
      if (this.nameIs(i, name)) return this.value(i);
    }
    return null;
  }
}

// Walks JSON the host wrote: finds where each value ends, and checks no more of it than that.
class Scanner {
  constructor(
    public at: i32,
    public end: i32,
  ) {}

  ws(): void {
    while (this.at < this.end) {
      const c = byteAt(this.at);
      if (c != 0x20 && c != 0x09 && c != 0x0a && c != 0x0d) break;
      this.at++;
    }
  }

  expect(c: i32): void {
    this.ws();
    if (this.at >= this.end || byteAt(this.at) != c) abort("unexpected JSON", null, 0, 0);
    this.at++;
  }

  // Skips the string at the cursor.
  string(): void {
    this.ws();
    if (this.at >= this.end || byteAt(this.at) != 0x22) abort("no JSON string", null, 0, 0);
    this.at++;
    while (this.at < this.end) {
      const c = byteAt(this.at);
      this.at += c == 0x5c ? 2 : 1;
      if (c == 0x22) return;
    }
    abort("an unterminated JSON string", null, 0, 0);
  }

  // Skips the value at the cursor.
  value(): void {
    this.ws();
    const c = byteAt(this.at);
    if (c == 0x22) {
      this.string();
      return;
    }
    if (c == 0x7b || c == 0x5b) {
      let depth = 0;
      while (this.at < this.end) {
        const d = byteAt(this.at);
        if (d == 0x22) {
          this.string();
          continue;
        }
        if (d == 0x7b || d == 0x5b) depth++;
        else if (d == 0x7d || d == 0x5d) depth--;
        this.at++;
        if (depth == 0) return;
      }
      abort("an unterminated JSON object or array", null, 0, 0);
    }
    while (this.at < this.end) {
      const d = byteAt(this.at);
      if (d == 0x2c || d == 0x7d || d == 0x5d || d == 0x20 || d == 0x0a || d == 0x09 || d == 0x0d) {
        return;
      }
      this.at++;
    }
  }

  members(): Members {
    const members = new Members();
    this.expect(0x7b);
    this.ws();
    if (this.at < this.end && byteAt(this.at) == 0x7d) {
      this.at++;
      return members;
    }
    while (true) {
      this.ws();
      const nameStart = this.at;
      this.string();
      const nameEnd = this.at;
      this.expect(0x3a);
      this.ws();
      const valueStart = this.at;
      this.value();
      members.ranges.push(nameStart);
      members.ranges.push(nameEnd);
      members.ranges.push(valueStart);
      members.ranges.push(this.at);
      this.ws();
      if (this.at < this.end && byteAt(this.at) == 0x2c) {
        this.at++;
        continue;
      }
      this.expect(0x7d);
      return members;
    }
  }
}

// The members of the JSON object `json`.
export function members(json: Json): Members {
  return new Scanner(json.start, json.end).members();
}

// One new event (docs/TRANSFORMS.md "What a module is given").
export class Event {
  // The event's value: its members (those Contract.reads names when the module declared
  // them, else all).
  value: Members = new Members();
  id: string = "";
  // The event's entity, which its state belongs to.
  entity: string = "";
  // The event time in UTC (RFC 3339); "" when the event has none.
  occurredAt: string = "";
  // The record key as text; "" when the record has none.
  key: string = "";
  // The record's headers, each a JSON string (or null).
  headers: Members = new Members();
}

// What apply is called with.
export class Input {
  constructor(
    // What the module answered as the entity's state last time; null when it is null (before
    // the entity's first event).
    public state: Json | null,
    public event: Event,
  ) {}
}

function optionalString(json: Json): string {
  return json.isNull() ? "" : json.string();
}

// Reads apply's input. Its values are ranges of a buffer the next call's input takes: read
// them in this call.
export function readInput(): Input {
  const top = new Scanner(0, loadInput()).members();
  const event = new Event();
  let state: Json | null = top.get("state");
  if (state !== null && state.isNull()) state = null;
  const raw = top.get("event");
  if (raw === null) abort("the input has no event", null, 0, 0);
  const parts = members(raw!);
  for (let i = 0; i < parts.length; i++) {
    const part = parts.value(i);
    if (parts.nameIs(i, "value")) event.value = members(part);
    else if (parts.nameIs(i, "event_id")) event.id = part.string();
    else if (parts.nameIs(i, "entity")) event.entity = part.string();
    else if (parts.nameIs(i, "occurred_at")) event.occurredAt = optionalString(part);
    else if (parts.nameIs(i, "key")) event.key = optionalString(part);
    else if (parts.nameIs(i, "headers")) event.headers = members(part);
  }
  return new Input(state, event);
}

// ---- writing --------------------------------------------------------------------------------

// `text` as a JSON string, escaped as the results are: for a module that composes JSON text of
// its own (an output's value, its state).
export function quote(text: string): string {
  const start = outLength;
  putString(text);
  const quoted = String.UTF8.decodeUnsafe(out.dataStart + start, outLength - start);
  outLength = start;
  return quoted;
}

// One record to write.
export class Output {
  // The output: DEFAULT_OUTPUT or a name configured with --output NAME=TOPIC.
  name: string = DEFAULT_OUTPUT;
  // The record key; null keys it by the event's entity.
  key: string | null = null;
  // The record's value as JSON text; or, when it is null,
  value: string | null = null;
  // the names and JSON texts of the members to set on the event's value, which then is the
  // record's value (event_value_with): the host builds it.
  withNames: string[] = [];
  withValues: string[] = [];
  // Headers of its own, as names and texts in the order of their names.
  headerNames: string[] = [];
  headerValues: string[] = [];

  write(): void {
    putText('{"output":');
    putString(this.name);
    const key = this.key;
    if (key !== null) {
      putText(',"key":');
      putString(key);
    }
    const value = this.value;
    if (value !== null) {
      putText(',"value":');
      putText(value);
    } else {
      putText(',"event_value_with":{');
      for (let i = 0; i < this.withNames.length; i++) {
        if (i > 0) put(0x2c);
        putString(this.withNames[i]);
        put(0x3a);
        putText(this.withValues[i]);
      }
      put(0x7d);
    }
    if (this.headerNames.length > 0) {
      putText(',"headers":{');
      for (let i = 0; i < this.headerNames.length; i++) {
        if (i > 0) put(0x2c);
        putString(this.headerNames[i]);
        put(0x3a);
        putString(this.headerValues[i]);
      }
      put(0x7d);
    }
    put(0x7d);
  }
}

// Answers apply with the entity's new state (JSON text) and the outputs.
export function apply(state: string, outputs: Output[]): void {
  outLength = 0;
  putText('{"state":');
  putText(state);
  if (outputs.length > 0) {
    putText(',"outputs":[');
    for (let i = 0; i < outputs.length; i++) {
      if (i > 0) put(0x2c);
      outputs[i].write();
    }
    put(0x5d);
  }
  put(0x7d);
  send();
}

// Answers apply with a refusal: the event becomes a dead letter whose
// eos-dlq-transform-reason is `code`.
export function refuse(code: string, detail: string): void {
  outLength = 0;
  putText('{"refusal":{"code":');
  putString(code);
  putText(',"detail":');
  putString(detail);
  putText("}}");
  send();
}

// A trap with the message in the host's error: the processor dead-letters the event.
export function abort(
  message: string | null,
  fileName: string | null,
  line: u32,
  column: u32,
): void {
  unreachable();
}
