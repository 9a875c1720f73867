"""Where a training step's exchange time goes, from a gradcomp timeline (GRADCOMP_TIMELINE).

    python3 examples/benchmarks/step_phases.py TIMELINE [--rate-gbit 1] [--prefix allreduce.]

A step starts when a gradient already seen in the current step is queued again (the optimizer
enqueues each gradient once a step). Per step, from rank 0's view:

- backward window: first gradient queued -> last gradient queued (backward producing them);
- each response (one ALLREDUCE span, or an uncompressed COMMUNICATE): when its last tensor was
  queued, when it began (the wait between is negotiation: the other ranks' readiness, or the
  background thread still busy with an earlier response), how long it ran, its wire bytes and
  what they take at the link's rate;
- exposed: last gradient queued -> last exchange done (what the step waits for after backward);
- the helper threads' COMPRESS and DECOMPRESS time (they overlap the wire).

Prints the median over the timed steps (the first `--skip` steps are warm-up) as Markdown.
"""
import argparse
import json
import statistics


def load(path):
    """The trace's events (a timeline being written lacks its closing bracket)."""
    text = open(path).read().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def tensor_names(events):
    return {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")}


def steps_of(events, names, prefix):
    """Each step's events: a list of (time ms, phase, name, event)."""
    steps, seen, cur = [], set(), None
    for e in sorted((e for e in events if e.get("ph") in ("B", "E", "i")), key=lambda e: e["ts"]):
        name = names.get((e["pid"], e.get("tid")), "")
        if not name.startswith(prefix):
            continue
        if e["ph"] == "i" and e.get("name") == "queued":
            if cur is None or name in seen:
                cur, seen = [], set()
                steps.append(cur)
            seen.add(name)
        if cur is not None:
            cur.append((e["ts"] / 1000.0, e["ph"], name, e))
    return steps


def responses_of(step):
    """The step's responses: [began, ended, wire bytes, its last tensor queued], in order of
    their start."""
    queued, open_, out = {}, {}, []
    for t, ph, name, e in step:
        what = e.get("name")
        if ph == "i" and what == "queued":
            queued[name] = t
        elif ph == "B" and what in ("ALLREDUCE", "COMMUNICATE") and name not in open_:
            open_[name] = (what, t)
        elif ph == "E" and name in open_ and open_[name][0] == what:
            _, began = open_.pop(name)
            out.append((began, t, int(e.get("args", {}).get("wire_bytes", 0)), queued.get(name, began)))
    # Tensors fused into one response share its begin and end: one row each.
    fused = {}
    for began, ended, wire, q in out:
        key = (round(began, 3), round(ended, 3))
        b = fused.setdefault(key, [began, ended, 0, q])
        b[2] += wire
        b[3] = max(b[3], q)
    return sorted(fused.values())


def phase_ms(step, phase):
    total, open_ = 0.0, {}
    for t, ph, name, e in step:
        if e.get("name") != phase:
            continue
        if ph == "B":
            open_[name] = t
        elif ph == "E" and name in open_:
            total += t - open_.pop(name)
    return total


def summarize(step, rate_gbit):
    queued = [t for t, ph, _, e in step if ph == "i" and e.get("name") == "queued"]
    rs = [r for r in responses_of(step) if r[2] > 0 or r[1] - r[0] > 0.05]
    ends = [r[1] for r in rs]
    wire_ms = lambda b: b * 8 / (rate_gbit * 1e6)  # noqa: E731
    row = {
        "backward window (first -> last gradient queued)": max(queued) - min(queued),
        "exposed (last gradient queued -> last exchange done)": max(ends) - max(queued) if ends else 0.0,
        "exchange busy (sum of responses' spans)": sum(r[1] - r[0] for r in rs),
        "latency (response began - max(its last tensor queued, previous response done), summed)":
            sum(latency(rs, i) for i in range(len(rs))),
        "wire time of the step's bytes at the link's rate": wire_ms(sum(r[2] for r in rs)),
        "COMPRESS on the helper thread": phase_ms(step, "COMPRESS"),
        "DECOMPRESS on the helper thread": phase_ms(step, "DECOMPRESS"),
    }
    big = sorted(range(len(rs)), key=lambda i: -rs[i][2])[:4]
    for i in sorted(big):
        r = rs[i]
        label = f"response {i + 1} ({r[2] / 1e6:.2f} MB on the wire, {wire_ms(r[2]):.1f} ms at the rate)"
        row[f"{label}: last tensor queued, after the first gradient"] = r[3] - min(queued)
        row[f"{label}: latency"] = latency(rs, i)
        row[f"{label}: ran"] = r[1] - r[0]
    return row


def latency(rs, i):
    """How long response i waited with its tensors queued and the previous response done:
    negotiation (every rank's readiness, the cycle) rather than a busy background thread."""
    ready = max(rs[i][3], rs[i - 1][1] if i > 0 else rs[i][3])
    return max(0.0, rs[i][0] - ready)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timeline")
    p.add_argument("--rate-gbit", type=float, default=1.0, help="the link's rate, for the wire-time rows")
    p.add_argument("--prefix", default="allreduce.", help="the gradients' tensor names start with this")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out")
    a = p.parse_args()
    events = load(a.timeline)
    steps = steps_of(events, tensor_names(events), a.prefix)[a.skip:-1]  # the last may be cut short
    if not steps:
        raise SystemExit(f"step_phases: no complete step of tensors named {a.prefix}* in {a.timeline}")
    rows = [summarize(s, a.rate_gbit) for s in steps]
    starts = [min(t for t, *_ in s) for s in steps]
    periods = [b - a_ for a_, b in zip(starts, starts[1:])]
    print(f"{len(steps)} steps of rank 0's timeline, ms (median, min-max)\n")
    print("| phase | ms |\n|---|---|")
    if periods:
        print(f"| step (first gradient to the next step's) | {statistics.median(periods):.1f} "
              f"({min(periods):.1f}-{max(periods):.1f}) |")
    for key in rows[0]:
        vals = [r[key] for r in rows if key in r]
        print(f"| {key} | {statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f}) |")


if __name__ == "__main__":
    main()
