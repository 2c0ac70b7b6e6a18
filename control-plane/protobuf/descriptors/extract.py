#!/usr/bin/env python3
"""Extracts the Kubernetes protobuf descriptors compiled into Go binaries or Go sources.

Every `generated.pb.go` in k8s.io/api and k8s.io/apimachinery registers its gzipped
FileDescriptorProto with the gogo protobuf registry, so any binary linking those packages
carries the descriptors, gogoproto field options (nullable, customname) included. The
upstream `.proto` files alone lack those options, and `nullable` is what tells a Go pointer
field from a value field, which the JSON mapping needs (see ../README.md).

The same gzipped bytes are a `var fileDescriptor_... = []byte{...}` literal in each
`generated.pb.go`, which is where the packages no kubectl links come from
(k8s.io/apiextensions-apiserver's CustomResourceDefinition, k8s.io/kube-aggregator's
APIService).

Usage: extract.py OUT.binpb INPUT...
Each INPUT is a Go binary (e.g. kubectl), a `generated.pb.go`, or a descriptor set written by
this script before (to add to it). Writes a google.protobuf.FileDescriptorSet holding every
`k8s.io/...proto` file found, sorted by name. Uses only the Python standard library.
"""

import re
import sys
import zlib

GZIP_MAGIC = re.compile(b"\x1f\x8b\x08")
# Enough for the largest descriptor (core/v1 is about 75 KB uncompressed).
WINDOW = 4 << 20


def read_varint(buf, pos):
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def write_varint(value):
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def descriptor_name(data):
    """The FileDescriptorProto.name (field 1) if `data` starts with it, else None."""
    if len(data) < 2 or data[0] != 0x0A:
        return None
    try:
        length, pos = read_varint(data, 1)
        name = data[pos : pos + length].decode("utf-8")
    except (IndexError, UnicodeDecodeError):
        return None
    return name if name.startswith("k8s.io/") and name.endswith(".proto") else None


def from_binary(binary, files):
    for match in GZIP_MAGIC.finditer(binary):
        try:
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(
                binary[match.start() : match.start() + WINDOW]
            )
        except zlib.error:
            continue
        add(descriptor_name(data), data, files)


GO_LITERAL = re.compile(rb"var fileDescriptor_\w+ = \[\]byte\{(.*?)\n\}", re.S)
GO_BYTE = re.compile(rb"0x([0-9a-f]{2})")


def from_go_source(source, files):
    for literal in GO_LITERAL.finditer(source):
        gzipped = bytes(int(b, 16) for b in GO_BYTE.findall(literal.group(1)))
        data = zlib.decompress(gzipped, 16 + zlib.MAX_WBITS)
        add(descriptor_name(data), data, files)


def from_descriptor_set(data, files):
    pos = 0
    while pos < len(data):
        if data[pos] != 0x0A:
            sys.exit("not a FileDescriptorSet")
        length, pos = read_varint(data, pos + 1)
        add(descriptor_name(data[pos : pos + length]), data[pos : pos + length], files)
        pos += length


def add(name, data, files):
    if name is None:
        return
    if name in files and files[name] != data:
        sys.exit(f"two different descriptors named {name}")
    files[name] = data


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    files = {}
    for path in sys.argv[2:]:
        data = open(path, "rb").read()
        if path.endswith(".go"):
            from_go_source(data, files)
        elif path.endswith(".binpb"):
            from_descriptor_set(data, files)
        else:
            from_binary(data, files)
    if "k8s.io/api/core/v1/generated.proto" not in files:
        sys.exit("no Kubernetes descriptors found in " + " ".join(sys.argv[2:]))
    with open(sys.argv[1], "wb") as out:
        for name in sorted(files):
            out.write(b"\x0a" + write_varint(len(files[name])) + files[name])
    print(f"wrote {len(files)} descriptors to {sys.argv[1]}")


if __name__ == "__main__":
    main()
