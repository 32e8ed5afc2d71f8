# SPDX-License-Identifier: Apache-2.0
"""wia-bench --plot: draws bus bandwidth against message size.

  wia_plot.py DATA.json OUT.png   draw DATA (written by wia-bench) into OUT
  wia_plot.py --check             exit 0 when matplotlib can be imported

wia-bench runs this with /usr/bin/python3 (Debian's interpreter, where
python3-matplotlib installs), falling back to python3 on PATH. DATA is

  {"comm": "in-process host devices", "ranks": 4, "transport": "memory",
   "dtype": "float32", "redop": "sum",
   "series": [{"op": "allreduce", "transport": "...",
               "points": [{"bytes": 8, "busbw": 0.01, "busbw_inplace": 0.01,
                           "bound": 0.5, "algorithm": "ring"}, ...]}]}

busbw and bound are GB/s; "bound" may be absent or null (no bound: only
the curve is drawn). One solid curve per op (out-of-place busbw) and, in
the same colour, a dashed line for its bound. For the caller's checks it
prints one line per series it drew ("# plot: allreduce: busbw 5 points,
bound 5 points, 8 B .. 64 KiB"), then "# plot: wrote OUT (W x H px, N
series): TITLE", and stores the op names in the PNG's "wia-series" text
chunk and the title in its "Title" chunk. Errors: one line on stderr naming what is wrong
and exit status 3 (matplotlib missing), 1 (cannot write OUT, bad DATA).
"""
import json
import math
import os
import sys

MISSING = 3


def fail(message, status=1):
    sys.stderr.write("wia-bench --plot: " + message + "\n")
    sys.exit(status)


def import_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        fail("python module 'matplotlib' is missing for %s (%s): install the Debian package "
             "python3-matplotlib (apt-get install python3-matplotlib; scripts/install-deps.sh "
             "installs it)" % (sys.executable, e), MISSING)
    return plt, FuncFormatter


def size_text(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return "%d %s" % (b // scale, unit)
    return "%d B" % b if b == int(b) else "%.3g B" % b


def main(argv):
    if len(argv) == 2 and argv[1] == "--check":
        import_matplotlib()
        return 0
    if len(argv) != 3:
        fail("usage: wia_plot.py DATA.json OUT.png | --check", 2)
    data_path, out = argv[1], argv[2]
    try:
        with open(data_path) as f:
            data = json.load(f)
        series = data["series"]
    except (OSError, ValueError, KeyError) as e:
        fail("cannot read the data file %s: %s" % (data_path, e))
    plt, FuncFormatter = import_matplotlib()

    fig, ax = plt.subplots(figsize=(10, 6), dpi=100)
    drawn = []
    transports = []
    for i, s in enumerate(series):
        pts = sorted((p for p in s["points"] if p.get("busbw") is not None),
                     key=lambda p: p["bytes"])
        if not pts:
            continue
        colour = "C%d" % (i % 10)
        x = [p["bytes"] for p in pts]
        label = "%s busbw" % s["op"]
        if s.get("transport") and s["transport"] != "memory":
            label += " (%s)" % s["transport"]
        ax.plot(x, [p["busbw"] for p in pts], "o-", color=colour, label=label)
        bound = [(p["bytes"], p["bound"]) for p in pts
                 if p.get("bound") is not None and math.isfinite(p["bound"])]
        if bound:
            ax.plot([b[0] for b in bound], [b[1] for b in bound], "--", color=colour,
                    alpha=0.7, label="%s bound (memcpy, same run)" % s["op"])
        if s.get("transport") and s["transport"] not in transports:
            transports.append(s["transport"])
        drawn.append(s["op"])
        print("# plot: %s: busbw %d points, bound %d points, %s .. %s" %
              (s["op"], len(pts), len(bound), size_text(x[0]), size_text(x[-1])))
    if not drawn:
        plt.close(fig)
        fail("nothing to draw: the run produced no sizes")

    transport = "+".join(transports) if transports else data.get("transport", "?")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_text(v)))
    ax.set_xlabel("message size (bytes of the whole vector, log2)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    title = "wia-bench: %s  |  %s, %d ranks, transport %s  |  %s %s" % (
        ", ".join(drawn), data.get("comm", "?"), data.get("ranks", 0), transport,
        data.get("dtype", "?"), data.get("redop", "?"))
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    # Written whole to OUT.tmp, then renamed: a reader never sees half a PNG.
    tmp = out + ".tmp"
    try:
        fig.savefig(tmp, format="png", metadata={"wia-series": ",".join(drawn), "Title": title,
                                                 "Software": "wia-bench --plot"})
        os.replace(tmp, out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fail("cannot write %s: %s" % (out, e.strerror or e))
    finally:
        plt.close(fig)
    width, height = (int(v) for v in fig.get_size_inches() * fig.dpi)
    print("# plot: wrote %s (%d x %d px, %d series): %s" % (out, width, height, len(drawn), title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
