# SPDX-License-Identifier: Apache-2.0
"""ctest tool_wia_bench_plot: is FILE the chart wia-bench --plot promises?

  check_plot.py FILE.png OP1,OP2,... TITLE-SUBSTRING

Reads the PNG byte by byte (signature, IHDR width and height, text chunks),
then decodes it with matplotlib: the "wia-series" chunk must list exactly
the ops expected, in order, the "Title" chunk must contain TITLE-SUBSTRING,
and the decoded image must have the IHDR's size and be more than a blank
canvas (several colours: curves, axes, text).
"""
import struct
import sys
import zlib


def main(path, ops, title_part):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature: %r" % data[:8]
    at, chunks, text = 8, [], {}
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        crc = struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0]
        assert zlib.crc32(kind + body) == crc, "bad CRC in chunk %r" % kind
        chunks.append(kind)
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            # compression flag, method, language\0, translated keyword\0, text
            flag, rest = rest[0], rest[2:]
            _, _, rest = rest.partition(b"\0")
            _, _, value = rest.partition(b"\0")
            text[key.decode("latin-1")] = (zlib.decompress(value) if flag else value).decode()
        at += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", chunks
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0, (width, height)
    assert text.get("wia-series") == ops, "series drawn %r, expected %r" % (
        text.get("wia-series"), ops)
    assert title_part in text.get("Title", ""), "title %r lacks %r" % (
        text.get("Title"), title_part)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    image = plt.imread(path)
    assert image.shape[0] == height and image.shape[1] == width, (image.shape, width, height)
    colours = {tuple(px) for px in image[::7, ::7].reshape(-1, image.shape[2]).tolist()}
    assert len(colours) > 10, "only %d colours: a blank chart?" % len(colours)
    print("check_plot: %s: PNG %d x %d, series %s, title %r, %d colours" %
          (path, width, height, text["wia-series"], text["Title"], len(colours)))


if __name__ == "__main__":
    main(*sys.argv[1:4])
