"""``docs/isa.md``: every instruction, descriptor field and code with its bit positions, generated
from the layouts of `tpugen.isa` and the comments beside their fields.

Regenerate with ``python -m tpugen.isa_doc > docs/isa.md`` (a test checks it is current)."""
import inspect
import re

from amaranth.hdl import Shape
from amaranth.lib import data, enum

from . import isa

__all__ = ["isa_markdown"]

_SOURCE = inspect.getsource(isa)


def _comments():
    """Comment beside each field or enum member in isa.py, by (layout or enum name, field)."""
    comments, owner, last = {}, None, None
    for line in _SOURCE.splitlines():
        start = re.match(r"^(\w+) = data\.StructLayout\(|^class (\w+)\(enum\.Enum", line)
        if start:
            owner, last = start[1] or start[2], None
            continue
        field = re.match(r'^\s+"?(\w+)"?\s*[:=]\s*[^#]*?(?:#\s*(.*))?$', line)
        continuation = re.match(r"^\s+#\s*(.*)$", line)
        if owner and continuation and last:
            comments[owner, last] += " " + continuation[1]
        elif owner and field and not line.lstrip().startswith(("def ", "return", '"""')):
            last = field[1]
            comments[owner, last] = field[2] or ""
        elif not line.startswith((" ", "\t")) and line and not start:
            owner = None if not line.startswith(("})", ")")) else owner
    return comments


def _layout_name(layout):
    """The name of ``layout`` in `tpugen.isa`, or None."""
    return next((name for name, value in vars(isa).items() if value is layout), None)


def _kind(shape):
    if isinstance(shape, type) and issubclass(shape, enum.Enum):
        return f"`{shape.__name__}`"
    if isinstance(shape, data.Layout):
        return f"`{_layout_name(shape)}`"
    return "signed" if Shape.cast(shape).signed else "unsigned"


def _rows(layout, comments, offset=0, prefix=""):
    """(field, bits, width, kind, description) of ``layout``, nested layouts expanded."""
    owner = _layout_name(layout)
    rows = []
    for name, field in layout:
        shape, where = field.shape, offset + field.offset
        path = f"{prefix}{name}"
        if isinstance(shape, data.ArrayLayout):
            element = shape.elem_shape
            path = f"{path}[i], i = 0..{shape.length - 1}"
            rows.append((path, _bits(where, shape.size), shape.size,
                         f"{shape.length} x `{_layout_name(element)}`" if isinstance(
                             element, data.Layout) else "array",
                         comments.get((owner, name), "")))
            if isinstance(element, data.StructLayout):
                rows += _rows(element, comments, where, f"{prefix}{name}[i].")
                rows[-len(element.members):] = [
                    (row[0], row[1] + f" + {element.size}i", *row[2:])
                    for row in rows[-len(element.members):]]
            continue
        rows.append((path, _bits(where, field.width), field.width, _kind(shape),
                     comments.get((owner, name), "")))
        if isinstance(shape, data.StructLayout):
            rows += _rows(shape, comments, where, f"{path}.")
    return rows


def _bits(offset, width):
    return f"{offset + width - 1}:{offset}" if width > 1 else f"{offset}"


def _table(rows):
    lines = ["| field | bits | width | kind | meaning |", "| --- | ---: | ---: | --- | --- |"]
    lines += [f"| `{path}` | {bits} | {width} | {kind} | {text} |"
              for path, bits, width, kind, text in rows]
    return "\n".join(lines)


def _enum_table(enum_type, comments):
    lines = ["| name | value | meaning |", "| --- | ---: | --- |"]
    lines += [f"| `{member.name}` | {member.value} | "
              f"{comments.get((enum_type.__name__, member.name), '')} |" for member in enum_type]
    return "\n".join(lines)


def _policies():
    """The policies of every core, from the docstring of `tpugen.isa`."""
    text = inspect.getdoc(isa)
    return text[text.index("Policies of every core"):]


def isa_markdown():
    """The text of ``docs/isa.md``."""
    comments = _comments()
    parts = [
        "# Instruction set",
        "",
        "Generated from `tpugen/isa.py` by `python -m tpugen.isa_doc > docs/isa.md`; do not edit "
        "by hand. Bits count from the least significant bit of the instruction, which is "
        f"{isa.INSTRUCTION_BITS} bits ({isa.INSTRUCTION_BYTES} bytes, little endian in memory). "
        "Bits past an opcode's layout are ignored (see the policies below).",
        "",
        "## Policies", "", _policies(), "",
        "## Opcodes", "", _enum_table(isa.Opcode, comments), "",
    ]
    for opcode, layout in isa._LAYOUTS.items():
        name = _layout_name(layout)
        parts += [f"## {opcode.name}: " + (f"`{name}`" if name else "the header alone")
                  + f" ({layout.size} bits)", "",
                  _table(_rows(layout, comments)), ""]
    parts += [f"## LOAD with `header.im2col`: `LoadIm2colInstruction` "
              f"({isa.LoadIm2colInstruction.size} bits)", "",
              _table(_rows(isa.LoadIm2colInstruction, comments)), ""]
    for enum_type in (isa.SoftmaxMode, isa.ErrorCode):
        parts += [f"## `{enum_type.__name__}`", "", _enum_table(enum_type, comments), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(isa_markdown(), end="")
