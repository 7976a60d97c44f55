#!/usr/bin/env bash
# The main job (`make demo`): a payments → ledger pipeline through eos-processor while the
# processor is SIGKILLed several times, then `eosctl audit` proves the result by event_id.
# Exits with the audit's status: 0 only when every input is accounted for exactly once.
#
# Knobs: GUARANTEE (exactly-once | at-least-once), DEMO_EVENTS (20000), DEMO_KILLS (5),
#        DEMO_RATE (2000 records/s), EOS_BIN_DIR (target/release).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin="${EOS_BIN_DIR:-target/release}"
guarantee="${GUARANTEE:-exactly-once}"
events="${DEMO_EVENTS:-20000}"
kills="${DEMO_KILLS:-5}"
rate="${DEMO_RATE:-2000}"
for tool in eosctl eos-processor; do
    [[ -x $bin/$tool ]] || { echo "demo: $bin/$tool is missing; run 'make demo' (it builds first)" >&2; exit 2; }
done

run="$(date +%Y%m%d-%H%M%S)-$$"
input="demo-payments-$run"
output="demo-ledger-$run"
group="demo-$run"
logs=".stack/demo/$run"
mkdir -p "$logs"

processor_pid=""
producer_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    for pid in $processor_pid $producer_pid; do
        kill -KILL "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT

start_processor() {
    "$bin/eos-processor" --input-topic "$input" --output-topic "$output" --group-id "$group" \
        --instance-id demo --guarantee "$guarantee" --metrics-addr 127.0.0.1:0 \
        >>"$logs/processor.log" 2>&1 &
    processor_pid=$!
}

echo "== eos-suite demo ($guarantee): $events payments, $kills SIGKILLs of the processor"
echo "   topics: $input -> $output (dead letters: $input.dlq); logs: $logs"
echo "== producing at $rate/s: 5% re-deliveries, 0.5% malformed, 0.1% reused ids with other content"
"$bin/eosctl" produce --topic "$input" --count "$events" --duplicate-ratio 0.05 \
    --bad-ratio 0.005 --conflict-ratio 0.001 --rate "$rate" --seed 42 --json \
    >"$logs/produce.json" 2>"$logs/produce.log" &
producer_pid=$!

for ((i = 1; i <= kills; i++)); do
    start_processor
    sleep "$((1 + RANDOM % 3)).$((RANDOM % 10))"
    kill -KILL "$processor_pid"
    wait "$processor_pid" 2>/dev/null || true
    echo "   SIGKILL #$i of eos-processor (pid $processor_pid)"
done

start_processor
wait "$producer_pid"
producer_pid=""
echo "== producer done: $(tr -d '\n' <"$logs/produce.json" | cut -c1-160)…"
echo "== waiting for the processor to drain the input"
"$bin/eosctl" lag --group "$group" --topic "$input" --wait --timeout 180s >/dev/null
kill -TERM "$processor_pid"
wait "$processor_pid" || { echo "demo: the processor did not stop cleanly; see $logs/processor.log" >&2; exit 2; }
processor_pid=""

echo "== audit: the logical set by event_id, read with read_committed"
status=0
"$bin/eosctl" audit --input "$input" --output "$output" || status=$?
if [[ $status -eq 0 ]]; then
    echo "== exact: every input accounted for exactly once through $kills hard kills"
else
    echo "== NOT exact (audit exit $status)$([[ $guarantee == at-least-once ]] && echo ': this is what at-least-once does under kills')"
fi
exit "$status"
