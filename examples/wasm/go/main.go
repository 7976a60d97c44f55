// Card authorisations as a WebAssembly transform for eos-processor: the logic of
// examples/card-authorisations/src/lib.rs in Go, built with the Extism Go PDK
// (docs/TRANSFORMS.md "WebAssembly transforms").
//
// Per card and UTC day it keeps what was spent in each currency, in minor units. An
// authorisation that would take the day's spend in its currency above the daily limit is
// refused (over_daily_limit); every other one is approved to the default output, and one of at
// least the flag threshold goes to the "flagged" output as well. Amounts are decimal strings
// and never become floats; the day comes from the event's time, never from the clock, so a
// replay computes the same thing.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/extism/go-pdk"
)

// The interface this module implements; the host refuses to start with any other.
const interfaceVersion = "eos-transform/1"

// The same defaults as the Rust example's --daily-limit and --flag-at, in minor units.
const (
	dailyLimit = 100000
	flagAt     = 50000
)

// The per-card state: the UTC day of the latest authorisation and the spend per currency.
type cardDay struct {
	Day   string           `json:"day"`
	Spent map[string]int64 `json:"spent"`
}

type event struct {
	Value      map[string]json.RawMessage `json:"value"`
	EventID    string                     `json:"event_id"`
	Entity     string                     `json:"entity"`
	OccurredAt *string                    `json:"occurred_at"`
}

type input struct {
	State *cardDay `json:"state"`
	Event event    `json:"event"`
}

type output struct {
	Output  string            `json:"output"`
	Value   any               `json:"value"`
	Headers map[string]string `json:"headers,omitempty"`
}

type refusal struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

type result struct {
	State   *cardDay `json:"state,omitempty"`
	Outputs []output `json:"outputs,omitempty"`
	Refusal *refusal `json:"refusal,omitempty"`
}

//go:wasmexport eos_interface_version
func eosInterfaceVersion() int32 {
	pdk.OutputString(interfaceVersion)
	return 0
}

//go:wasmexport apply
func apply() int32 {
	var in input
	decoder := json.NewDecoder(bytes.NewReader(pdk.Input()))
	decoder.UseNumber()
	if err := decoder.Decode(&in); err != nil {
		pdk.SetError(fmt.Errorf("input does not decode: %w", err))
		return 1
	}
	out := authorise(in)
	if err := pdk.OutputJSON(out); err != nil {
		pdk.SetError(err)
		return 1
	}
	return 0
}

func refuse(code, detail string) result {
	return result{Refusal: &refusal{Code: code, Detail: detail}}
}

func authorise(in input) result {
	card := cardDay{Spent: map[string]int64{}}
	if in.State != nil {
		card = *in.State
		if card.Spent == nil {
			card.Spent = map[string]int64{}
		}
	}
	var amountText string
	if err := json.Unmarshal(in.Event.Value["amount"], &amountText); err != nil {
		return refuse("invalid_amount", fmt.Sprintf("amount %s is not a decimal string with up to 2 places", in.Event.Value["amount"]))
	}
	amount, ok := minorUnits(amountText)
	if !ok {
		return refuse("invalid_amount", fmt.Sprintf("amount %q is not a decimal string with up to 2 places", amountText))
	}
	var currency string
	if json.Unmarshal(in.Event.Value["currency"], &currency) != nil || !isCurrency(currency) {
		return refuse("invalid_currency", "currency is not an ISO 4217 code")
	}
	if in.Event.OccurredAt == nil || len(*in.Event.OccurredAt) < 10 {
		return refuse("missing_time", "the authorisation has no /at")
	}
	// The host hands the event time over in UTC (RFC 3339), so its date is the UTC day.
	day := (*in.Event.OccurredAt)[:10]
	if card.Day != day {
		card.Day = day
		card.Spent = map[string]int64{}
	}
	spent := card.Spent[currency]
	after := spent + amount
	if after < spent || after > dailyLimit {
		return refuse("over_daily_limit", fmt.Sprintf(
			"card %s would spend %s %s on %s, over its daily limit of %s",
			in.Event.Entity, decimal(spent+amount), currency, card.Day, decimal(dailyLimit)))
	}
	card.Spent[currency] = after

	outputs := make([]output, 0, 2)
	if amount >= flagAt {
		outputs = append(outputs, output{
			Output: "flagged",
			Value: map[string]string{
				"auth_id":  in.Event.EventID,
				"card":     in.Event.Entity,
				"amount":   amountText,
				"currency": currency,
				"reason":   "large_amount",
			},
			Headers: map[string]string{"eos-flag": "large_amount"},
		})
	}
	approved := in.Event.Value
	approved["status"] = json.RawMessage(`"approved"`)
	approved["day_spent"] = json.RawMessage(strconv.Quote(decimal(after)))
	outputs = append(outputs, output{Output: "default", Value: approved})
	return result{State: &card, Outputs: outputs}
}

func isCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for _, b := range []byte(c) {
		if b < 'A' || b > 'Z' {
			return false
		}
	}
	return true
}

// "12.50" → 1250: digits, optionally a point and one or two more digits; no sign, no exponent,
// nothing past an int64.
func minorUnits(text string) (int64, bool) {
	units, cents, hasPoint := strings.Cut(text, ".")
	digits := func(part string) bool {
		if part == "" {
			return false
		}
		for _, b := range []byte(part) {
			if b < '0' || b > '9' {
				return false
			}
		}
		return true
	}
	if !digits(units) || (hasPoint && (!digits(cents) || len(cents) > 2)) {
		return 0, false
	}
	whole, err := strconv.ParseInt(units, 10, 64)
	if err != nil || whole > (1<<63-1)/100 {
		return 0, false
	}
	var minor int64
	switch len(cents) {
	case 0:
	case 1:
		minor = int64(cents[0]-'0') * 10
	default:
		minor = int64(cents[0]-'0')*10 + int64(cents[1]-'0')
	}
	if whole*100 > (1<<63-1)-minor {
		return 0, false
	}
	return whole*100 + minor, true
}

// 1250 → "12.50".
func decimal(minor int64) string {
	sign := ""
	abs := uint64(minor)
	if minor < 0 {
		sign = "-"
		abs = uint64(-minor)
	}
	return fmt.Sprintf("%s%d.%02d", sign, abs/100, abs%100)
}

// A c-shared (reactor) module still needs a main; it is never called.
func main() {}
