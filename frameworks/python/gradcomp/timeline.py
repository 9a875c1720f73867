"""Summarizes a gradcomp timeline (the Chrome trace GRADCOMP_TIMELINE / gcrun --timeline-filename
writes).

    python3 -m gradcomp.timeline timeline.json            # tables on stdout
    python3 -m gradcomp.timeline timeline.json --png t.png

Prints the time spent in each phase, per tensor the operations, time, bytes in, bytes on the
wire and compression ratio, and the slowest negotiations with the rank that arrived last (the
rank the others waited for). Open the file itself in Perfetto or chrome://tracing for the full
picture.
"""
import argparse
import collections
import json
import re
import sys

# Phases that cover a whole operation (the others nest inside them).
TOP_LEVEL = ("NEGOTIATE", "ALLREDUCE", "COMMUNICATE", "FUSE", "UNFUSE")
_READY = re.compile(r"rank (\d+) ready")


class Trace:
    """Parsed events: per tensor row its phases (name, begin us, end us, args) and marks."""

    def __init__(self, events):
        self.names = {}
        self.spans = collections.defaultdict(list)  # tensor -> [(phase, begin, end, args, depth)]
        self.marks = collections.defaultdict(list)  # tensor -> [(ts, text)]
        open_ = collections.defaultdict(list)
        for e in events:
            if not isinstance(e, dict) or "ph" not in e:
                continue
            tid = e.get("tid")
            if e["ph"] == "M" and e.get("name") == "thread_name":
                self.names[tid] = e.get("args", {}).get("name", str(tid))
            elif e["ph"] == "B":
                open_[tid].append((e["name"], e["ts"]))
            elif e["ph"] == "E":
                stack = open_[tid]
                for i in range(len(stack) - 1, -1, -1):  # the innermost open phase of that name
                    if stack[i][0] == e["name"]:
                        name, begin = stack.pop(i)
                        self.spans[tid].append((name, begin, e["ts"], e.get("args", {}), i))
                        break
            elif e["ph"] == "i":
                self.marks[tid].append((e["ts"], e["name"]))

    def tensor(self, tid):
        return self.names.get(tid, f"row {tid}")


def load(path):
    with open(path) as f:
        text = f.read()
    try:
        events = json.loads(text)
    except json.JSONDecodeError:
        # A trace cut off mid-write (the job was killed): keep every complete event.
        events = json.loads(text.rstrip().rstrip(",") + "]")
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return Trace(events)


def phase_table(trace):
    totals = collections.defaultdict(lambda: [0, 0.0])
    for spans in trace.spans.values():
        for name, begin, end, _, _ in spans:
            totals[name][0] += 1
            totals[name][1] += end - begin
    return sorted(((name, n, us) for name, (n, us) in totals.items()), key=lambda r: -r[2])


def tensor_table(trace):
    rows = []
    for tid, spans in trace.spans.items():
        ops = time_us = bytes_in = wire = 0
        codec = "none"
        for name, begin, end, args, depth in spans:
            if depth == 0 and name in TOP_LEVEL:
                time_us += end - begin
            if "bytes" in args:
                ops += 1
                bytes_in += args.get("bytes", 0)
                wire += args.get("wire_bytes", args.get("bytes", 0))
                codec = args.get("codec", codec)
        rows.append((trace.tensor(tid), ops, time_us, bytes_in, wire, codec))
    return sorted(rows, key=lambda r: -r[2])


def negotiations(trace):
    """(tensor, duration us, last rank, its lag behind the first in us), slowest first."""
    out = []
    for tid, spans in trace.spans.items():
        for name, begin, end, _, _ in spans:
            if name != "NEGOTIATE":
                continue
            ready = [(ts, int(m.group(1))) for ts, text in trace.marks[tid] if begin <= ts <= end
                     for m in [_READY.match(text)] if m]
            if ready:
                first, last = min(ready), max(ready)
                out.append((trace.tensor(tid), end - begin, last[1], last[0] - first[0]))
            else:
                out.append((trace.tensor(tid), end - begin, None, 0))
    return sorted(out, key=lambda r: -r[1])


def _ms(us):
    return f"{us / 1000:.3f}"


def report(trace, top=10, out=sys.stdout):
    print("## Time per phase (nested phases are counted inside their parents too)\n", file=out)
    print("| phase | count | total ms | mean ms |\n|---|---|---|---|", file=out)
    for name, n, us in phase_table(trace):
        print(f"| {name} | {n} | {_ms(us)} | {_ms(us / n)} |", file=out)
    print("\n## Per tensor\n", file=out)
    print("| tensor | ops | time ms | bytes in | bytes on wire | ratio | codec |\n|---|---|---|---|---|---|---|",
          file=out)
    total_in = total_wire = 0
    for name, ops, us, bytes_in, wire, codec in tensor_table(trace):
        ratio = f"{bytes_in / wire:.2f}" if wire else "-"
        print(f"| {name} | {ops} | {_ms(us)} | {bytes_in} | {wire} | {ratio} | {codec} |", file=out)
        total_in += bytes_in
        total_wire += wire
    if total_wire:
        print(f"\nAll tensors: {total_in} bytes in, {total_wire} on the wire ({total_in / total_wire:.2f}x smaller).",
              file=out)
    slow = negotiations(trace)[:top]
    print(f"\n## Slowest negotiations (top {len(slow)})\n", file=out)
    print("| tensor | negotiation ms | last rank ready | its lag ms |\n|---|---|---|---|", file=out)
    for name, us, last, lag in slow:
        who = "-" if last is None else str(last)
        print(f"| {name} | {_ms(us)} | {who} | {_ms(lag)} |", file=out)


def draw(trace, path, max_rows=40):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"NEGOTIATE": "#bbbbbb", "ALLREDUCE": "#4c72b0", "COMMUNICATE": "#55a868", "COMPRESS": "#c44e52",
              "DECOMPRESS": "#dd8452", "FUSE": "#8172b3", "UNFUSE": "#937860"}
    rows = sorted(trace.spans, key=lambda tid: min(b for _, b, _, _, _ in trace.spans[tid]))[:max_rows]
    fig, ax = plt.subplots(figsize=(12, 1 + 0.35 * len(rows)))
    t0 = min((b for tid in rows for _, b, _, _, _ in trace.spans[tid]), default=0)
    for y, tid in enumerate(rows):
        for name, begin, end, _, depth in sorted(trace.spans[tid], key=lambda s: s[4]):  # parents first
            h = 0.8 / (1 + depth)
            ax.barh(y, (end - begin) / 1000, left=(begin - t0) / 1000, height=h,
                    color=colors.get(name, "#999999"), edgecolor="none")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([trace.tensor(tid) for tid in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first event")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), fontsize=7, loc="lower right", ncol=4)
    ax.set_title("gradcomp timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m gradcomp.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a timeline written by gradcomp (Chrome trace JSON)")
    parser.add_argument("--png", help="also draw the phases per tensor into this PNG")
    parser.add_argument("--top", type=int, default=10, help="how many slow negotiations to list")
    args = parser.parse_args(argv)
    try:
        trace = load(args.file)
    except (OSError, ValueError) as e:
        print(f"gradcomp.timeline: cannot read {args.file}: {e}", file=sys.stderr)
        return 2
    if not trace.spans:
        print(f"gradcomp.timeline: {args.file} has no phases (was the timeline recording while tensors ran?)",
              file=sys.stderr)
        return 1
    report(trace, args.top)
    if args.png:
        try:
            import matplotlib  # noqa: F401 - draw's
        except ImportError:
            print("gradcomp.timeline: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
        draw(trace, args.png)
        print(f"\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
