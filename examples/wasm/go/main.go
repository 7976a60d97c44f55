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
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"eos-suite/examples/wasm/card/eos"
	"github.com/extism/go-pdk"
)

// The same defaults as the Rust example's --daily-limit and --flag-at, in minor units.
const (
	dailyLimit = 100000
	flagAt     = 50000
)

// The output large authorisations also go to (--output flagged=TOPIC).
const flaggedOutput = "flagged"

//go:wasmexport eos_interface_version
func eosInterfaceVersion() int32 {
	eos.OutputVersion()
	return 0
}

// Where the authorisations keep their id, card and time, the outputs written to and the
// members read: the processor needs no --event-id, --entity or --occurred-at, refuses to start
// without --output flagged=TOPIC, and hands apply only the amount and the currency of each
// authorisation's value (the rest reaches the outputs through eos.Output.With).
//
//go:wasmexport eos_contract
func eosContract() int32 {
	eos.OutputContract(eos.Contract{
		EventID:    "/auth_id",
		Entity:     "/card",
		OccurredAt: "/at",
		Outputs:    []string{eos.DefaultOutput, flaggedOutput},
		Reads:      []string{"amount", "currency"},
	})
	return 0
}

//go:wasmexport apply
func apply() int32 {
	in, err := eos.ReadInput()
	if err != nil {
		pdk.SetError(fmt.Errorf("input does not decode: %w", err))
		return 1
	}
	if err := authorise(in); err != nil {
		pdk.SetError(err)
		return 1
	}
	return 0
}

// The per-card state: the UTC day of the latest authorisation and the spend per currency.
type cardDay struct {
	day   string
	spent map[string]int64
}

// `{"day": "2026-12-04", "spent": {"EUR": 1250}}`, or null before the card's first event.
func readCard(raw []byte) (cardDay, error) {
	card := cardDay{spent: map[string]int64{}}
	if string(raw) == "null" {
		return card, nil
	}
	state, err := eos.ParseObject(raw)
	if err != nil {
		return card, err
	}
	card.day, _ = state.String("day")
	if spent, ok := state.Get("spent"); ok && string(spent) != "null" {
		currencies, err := eos.ParseObject(spent)
		if err != nil {
			return card, err
		}
		for _, currency := range currencies {
			minor, err := strconv.ParseInt(string(currency.Raw), 10, 64)
			if err != nil {
				return card, errors.New("the state's spend is not a whole number")
			}
			card.spent[currency.Name()] = minor
		}
	}
	return card, nil
}

// The state as encoding/json writes a struct of the two: the currencies in order.
func (card cardDay) json() []byte {
	var w eos.Writer
	w.Text(`{"day":`)
	w.String(card.day)
	w.Text(`,"spent":{`)
	currencies := make([]string, 0, len(card.spent))
	for currency := range card.spent {
		currencies = append(currencies, currency)
	}
	sort.Strings(currencies)
	for i, currency := range currencies {
		if i > 0 {
			w.Byte(',')
		}
		w.String(currency)
		w.Byte(':')
		w.Int(card.spent[currency])
	}
	w.Text(`}}`)
	return w.Bytes()
}

func authorise(in eos.Input) error {
	card, err := readCard(in.State)
	if err != nil {
		return err
	}
	value := in.Event.Value
	// The amount is a string: null reads as "", anything else is shown as it came.
	amountRaw, _ := value.Get("amount")
	var amountText string
	switch {
	case string(amountRaw) == "null":
	case len(amountRaw) > 0 && amountRaw[0] == '"':
		amountText, _ = eos.Unquote(amountRaw)
	default:
		eos.Refuse("invalid_amount", fmt.Sprintf("amount %s is not a decimal string with up to 2 places", amountRaw))
		return nil
	}
	amount, ok := minorUnits(amountText)
	if !ok {
		eos.Refuse("invalid_amount", fmt.Sprintf("amount %q is not a decimal string with up to 2 places", amountText))
		return nil
	}
	currency, _ := value.String("currency")
	if !isCurrency(currency) {
		eos.Refuse("invalid_currency", "currency is not an ISO 4217 code")
		return nil
	}
	if len(in.Event.OccurredAt) < 10 {
		eos.Refuse("missing_time", "the authorisation has no /at")
		return nil
	}
	// The host hands the event time over in UTC (RFC 3339), so its date is the UTC day.
	day := in.Event.OccurredAt[:10]
	if card.day != day {
		card.day = day
		card.spent = map[string]int64{}
	}
	spent := card.spent[currency]
	after := spent + amount
	if after < spent || after > dailyLimit {
		eos.Refuse("over_daily_limit", fmt.Sprintf(
			"card %s would spend %s %s on %s, over its daily limit of %s",
			in.Event.Entity, decimal(spent+amount), currency, card.day, decimal(dailyLimit)))
		return nil
	}
	card.spent[currency] = after

	outputs := make([]eos.Output, 0, 2)
	if amount >= flagAt {
		var flagged eos.Writer
		flagged.Text(`{"amount":`)
		flagged.String(amountText)
		flagged.Text(`,"auth_id":`)
		flagged.String(in.Event.ID)
		flagged.Text(`,"card":`)
		flagged.String(in.Event.Entity)
		flagged.Text(`,"currency":`)
		flagged.String(currency)
		flagged.Text(`,"reason":"large_amount"}`)
		outputs = append(outputs, eos.Output{
			Name:    flaggedOutput,
			Value:   flagged.Bytes(),
			Headers: map[string]string{"eos-flag": "large_amount"},
		})
	}
	// The authorisation as it came, approved: the host sets the two members on the event's
	// value, so the module never writes the event again.
	outputs = append(outputs, eos.Output{
		Name: eos.DefaultOutput,
		With: eos.Object{
			eos.NewMember("day_spent", []byte(strconv.Quote(decimal(after)))),
			eos.NewMember("status", []byte(`"approved"`)),
		},
	})
	eos.Apply(card.json(), outputs...)
	return nil
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
