#!/usr/bin/env python3
"""Writes the runtime's op table from the ODS definitions of the ops a plan may hold.

Input: `llvm-tblgen --dump-json` of dialect/DlossOps.td and of MLIR's
ArithOps.td. Output: one C++ initializer per op (name, operand and result
counts, each attribute's plan kind and whether it may be absent, and the
facts its traits state: Dloss_IndexOperand, Dloss_Collective, Dloss_Internal,
Dloss_IsFused in dialect/DlossInterfaces.td), included by the runtime's op table
(runtime/kernels/OpTable.cpp). The
runtime builds where no LLVM is installed, so the table is committed; the
build regenerates it and a test fails when the two differ (as for
docs/DlossDialect.md).

Usage: gen_op_table.py OUT DIALECT_PREFIX=JSON [DIALECT_PREFIX=JSON ...]
"""
import json
import sys


def superclasses(record):
    return set(record.get("!superclasses", []))


def resolve(records, ref):
    """The record a dag argument or field names."""
    return records[ref["def"]] if isinstance(ref, dict) else records[ref]


def is_int_enum(records, record):
    """An integer enum (I32EnumAttr, or an EnumAttr over one)."""
    if record.get("enumerants"):
        return True
    if isinstance(record.get("enum"), dict):
        return is_int_enum(records, resolve(records, record["enum"]))
    return False


def attribute(records, record):
    """(kind, optional) of an attribute constraint, as a plan carries it."""
    supers = superclasses(record)
    optional = bool(record.get("isOptional")) or (
        "DefaultValuedAttr" in supers or "DefaultValuedOptionalAttr" in supers)
    base = record
    while isinstance(base.get("baseAttr"), dict):
        base = resolve(records, base["baseAttr"])
    supers |= superclasses(base)
    if isinstance(base.get("enum"), dict):  # an EnumAttr: its enum's kind
        supers |= superclasses(resolve(records, base["enum"]))
    name = base["!name"]
    if name == "UnitAttr":
        return "Flag", True
    if "BitEnumAttrBase" in supers or "BitEnumAttr" in supers:
        return "Integer", optional  # flags travel as their bits
    if is_int_enum(records, base):
        return "Text", optional  # enums travel by name
    if "DenseArrayAttrBase" in supers or name.startswith("DenseI64ArrayAttr"):
        return "Integers", optional
    if "FloatAttrBase" in supers or name in ("F64Attr", "F32Attr"):
        return "Real", optional
    if ("SignlessIntegerAttrBase" in supers or "TypedSignlessIntegerAttrBase" in supers
            or name in ("I64Attr", "I32Attr", "IndexAttr", "BoolAttr")):
        return "Integer", optional
    if name == "StrAttr" or "StringBasedAttr" in supers:
        return "Text", optional
    return "Any", optional  # a typed constant (arith.constant's value)


def operand_counts(records, args):
    lo = hi = 0
    for ref, _ in args:
        supers = superclasses(resolve(records, ref))
        if "Variadic" in supers:
            hi = -1
        elif "Optional" in supers:
            hi = hi if hi < 0 else hi + 1
        else:
            lo += 1
            hi = hi if hi < 0 else hi + 1
    return lo, hi


def result_count(records, results):
    """The number of results; -1 when a variadic list makes it any number."""
    for ref, _ in results:
        if "Variadic" in superclasses(resolve(records, ref)):
            return -1
    return len(results)


def traits_of(records, op):
    """Every trait record of an op, those that its traits imply included
    (a TraitList's members, a trait's dependentTraits)."""
    found = {}

    def visit(refs):
        for ref in refs:
            record = resolve(records, ref)
            if record["!name"] in found:
                continue
            found[record["!name"]] = record
            visit(record.get("traits") or [])
            visit(record.get("dependentTraits") or [])

    visit(op.get("traits") or [])
    return list(found.values())


def index_operand(records, op, name, operand_count, attrs):
    """(data, indices) of a Dloss_IndexOperand op, checked against the op."""
    marks = [t for t in traits_of(records, op)
             if "Dloss_IndexOperand" in superclasses(t)]
    if not marks:
        return None
    if len(marks) > 1:
        sys.exit("gen_op_table.py: %s has %d Dloss_IndexOperand traits (%s), "
                 "but the op table holds one index operand per op: mark one" %
                 (name, len(marks), ", ".join(
                     "<%d, %d>" % (m["dataOperand"], m["indicesOperand"])
                     for m in marks)))
    data, indices = marks[0]["dataOperand"], marks[0]["indicesOperand"]
    if max(data, indices) >= operand_count:
        sys.exit("gen_op_table.py: %s is a Dloss_IndexOperand<%d, %d>, but "
                 "has %d fixed operands: name operands it has" %
                 (name, data, indices, operand_count))
    if ("axis", "Integer") not in [(n, k) for n, k, _ in attrs]:
        sys.exit("gen_op_table.py: %s is a Dloss_IndexOperand, but has no "
                 "integer attribute `axis` (the dimension its indices index): "
                 "give it one, or do not mark it" % name)
    return data, indices


def ops_of(path, prefix):
    records = json.load(open(path))
    entries = []
    for op_name in records["!instanceof"]["Op"]:
        op = records[op_name]
        args = [(ref, name) for ref, name in op["arguments"]["args"]]
        operands = [(ref, name) for ref, name in args
                    if "Attr" not in superclasses(resolve(records, ref))]
        attrs = [(resolve(records, ref), name) for ref, name in args
                 if "Attr" in superclasses(resolve(records, ref))]
        lo, hi = operand_counts(records, operands)
        results = result_count(records, op["results"]["args"])
        kinds = [(name,) + attribute(records, record) for record, name in attrs]
        attr_text = ['{"%s", OpAttrKind::%s, %s}' %
                     (name, kind, "true" if optional else "false")
                     for name, kind, optional in kinds]
        full_name = "%s.%s" % (prefix, op["opName"])
        index = index_operand(records, op, full_name, lo, kinds)
        marks = {t["!name"] for t in traits_of(records, op)}
        flags = ["true" if mark in marks else "false" for mark in
                 ("Dloss_Collective", "Dloss_Internal", "Dloss_IsFused")]
        entries.append('{"%s", %d, %d, %d, {%s}, {%s}, %s},' %
                       (full_name, lo, hi, results, ", ".join(attr_text),
                        "%d, %d" % index if index else "", ", ".join(flags)))
    return sorted(entries)


def main(argv):
    out = argv[1]
    lines = ["// Generated by dialect/gen_op_table.py from the ops' ODS definitions: do not edit.",
             "// {name, min operands, max operands (-1: any), results (-1: any), {attributes},",
             "//  {index data operand, index indices operand} or {}, collective, internal,",
             "//  fused};",
             "// attribute: {name, plan kind, may be absent}."]
    for spec in argv[2:]:
        prefix, path = spec.split("=", 1)
        lines.extend(ops_of(path, prefix))
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main(sys.argv)
