#!/usr/bin/env python3
"""Lists the fields Go's encoding/json writes even when they are zero or nil.

A Go struct field whose `json` tag lacks `omitempty` is always written: a value scalar as its
zero (`""`, `false`, `0`), a nil pointer, slice or map as `null`. The protobuf descriptors
cannot tell these fields from `omitempty` ones, so this reads the Go types themselves.
(Value struct fields are not listed: the descriptors mark them `nullable=false`.)

Usage: json_zero_fields.py API_DIR APIMACHINERY_DIR APIEXTENSIONS_DIR AGGREGATOR_DIR \
           > json-zero-fields.txt
where the directories are checkouts of k8s.io/api, k8s.io/apimachinery,
k8s.io/apiextensions-apiserver and k8s.io/kube-aggregator at the version of the descriptor set
(v0.33.x). Writes one line per field:
    <proto message full name> <protobuf field name> <JSON zero value>
sorted. Uses only the Python standard library.
"""

import os
import re
import sys

BUILTIN_SCALARS = {
    "string": '""',
    "bool": "false",
    "int": "0",
    "int32": "0",
    "int64": "0",
    "uint32": "0",
    "uint64": "0",
    "float32": "0",
    "float64": "0",
}
STRUCT_START = re.compile(r"^type (\w+) struct \{\s*$")
NAMED_TYPE = re.compile(r"^type (\w+) (\w+)\s*(//.*)?$")
NAMED_COMPOSITE = re.compile(r"^type (\w+) (\[\]|map\[)")
FIELD = re.compile(r"^\s+(\w+)\s+(\S+)\s+`([^`]*)`")
JSON_TAG = re.compile(r'json:"([^"]*)"')
PROTOBUF_NAME = re.compile(r'protobuf:"[^"]*name=(\w+)')


def go_files(directory):
    for root, _, files in os.walk(directory):
        for name in sorted(files):
            if (
                name.endswith(".go")
                and not name.endswith("_test.go")
                and not name.startswith("zz_generated")
                and name not in ("generated.pb.go", "types_swagger_doc_generated.go")
            ):
                yield os.path.join(root, name)


def package_of(path, base, prefix):
    """The proto package of a Go file: its directory under `base` after `prefix`."""
    directory = os.path.relpath(os.path.dirname(path), base)
    return prefix + "." + directory.replace(os.sep, ".")


def scan(paths):
    """(named scalar, slice and map types by package, struct fields by (package, type))."""
    named = {}
    structs = []
    for path, package in paths:
        with open(path, encoding="utf-8") as source:
            lines = source.read().splitlines()
        current = None
        for line in lines:
            if current is None:
                match = NAMED_TYPE.match(line)
                if match and match.group(2) in BUILTIN_SCALARS:
                    named[(package, match.group(1))] = BUILTIN_SCALARS[match.group(2)]
                match = NAMED_COMPOSITE.match(line)
                if match:
                    named[(package, match.group(1))] = "null"
                match = STRUCT_START.match(line)
                if match:
                    current = match.group(1)
                continue
            if line.startswith("}"):
                current = None
                continue
            match = FIELD.match(line)
            if match:
                structs.append((package, current) + match.groups())
    return named, structs


def zero_of(go_type, package, named):
    if go_type.startswith(("*", "[]", "map[")):
        return "null"
    if go_type in BUILTIN_SCALARS:
        return BUILTIN_SCALARS[go_type]
    if "." not in go_type:
        return named.get((package, go_type))
    # A qualified type: only named scalars of the same API packages are listed.
    return None


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    api, apimachinery, apiextensions, aggregator = sys.argv[1:]
    paths = [(p, package_of(p, api, "k8s.io.api")) for p in go_files(api)]
    # One package each of the other repositories.
    for base, directory, package in [
        (apimachinery, "pkg/apis/meta/v1", "k8s.io.apimachinery.pkg.apis.meta.v1"),
        (
            apiextensions,
            "pkg/apis/apiextensions/v1",
            "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1",
        ),
        (
            aggregator,
            "pkg/apis/apiregistration/v1",
            "k8s.io.kube_aggregator.pkg.apis.apiregistration.v1",
        ),
    ]:
        directory = os.path.join(base, *directory.split("/"))
        paths += [(p, package) for p in go_files(directory) if os.path.dirname(p) == directory]
    named, structs = scan(paths)
    out = set()
    for package, type_name, _, go_type, tag in structs:
        json = JSON_TAG.search(tag)
        proto = PROTOBUF_NAME.search(tag)
        if not json or not proto:
            continue
        options = json.group(1).split(",")
        if options[0] in ("", "-") or "omitempty" in options[1:]:
            continue
        zero = zero_of(go_type, package, named)
        if zero is not None:
            out.add(f"{package}.{type_name} {proto.group(1)} {zero}")
    if not any(line.startswith("k8s.io.api.core.v1.ContainerStatus ready ") for line in out):
        sys.exit("ContainerStatus.ready not found: is API_DIR a k8s.io/api checkout?")
    for line in sorted(out):
        print(line)


if __name__ == "__main__":
    main()
