"""The CPU Numba compiles the kernels for, and the register tile of the matmul micro-kernel on it.

What the kernels may use is decided by the *target*, not by the host: Numba compiles for
``NUMBA_CPU_NAME`` (default: the host CPU) with ``NUMBA_CPU_FEATURES`` (default: the host's
features, or none for ``generic``). Numba's own rule keeps the host's features under any other name
(``numba/core/codegen.py``, ``_get_host_cpu_features``): ``NUMBA_CPU_NAME=haswell`` alone would
still compile AVX-512 code on an AVX-512 host. So that the name means that CPU, importing this
module (``miniflow`` does it first, before any kernel compiles) sets Numba's
``config.CPU_FEATURES`` to ``""`` when ``NUMBA_CPU_NAME`` names a CPU and ``NUMBA_CPU_FEATURES`` is
unset: LLVM then takes the named CPU's own features, the rule Numba already applies to ``generic``.
A name LLVM does not know (``Haswell`` for ``haswell``) is an ``ImportError`` naming the variable:
LLVM would compile for no CPU at all, and abort. A process that compiled Numba code before
importing miniflow keeps what it had; this module reads whatever Numba's compiler was created with.

The features are read back from LLVM, not from a table of CPU names: :func:`has` compiles a small
probe function per feature with a target machine made like Numba's (its triple, CPU name and
feature string, ``codegen().magic_tuple()``) and looks for the instruction in the assembly (a
``<16 x float>`` add in ``zmm`` registers: AVX-512F; ``vfmadd``: FMA; ``vcvtph2ps``: F16C;
``vcvtneps2bf16``: AVX512-BF16). Only plain LLVM IR is probed (no target intrinsic), so a target
without the feature compiles the probe to other instructions or library calls, never fails.

:data:`ISA` is one row of :data:`TILES`, chosen once: the vector width in float32 lanes, the
vector registers, and the register tile of ``matmul.outer_block_kernel`` (rows of out by vectors
of columns), after the per-ISA micro-kernel shapes of BLIS (``config/<arch>/
bli_cntx_init_<arch>.c``: haswell sgemm 6 x 16, skx 32 x 12) and XNNPACK (``src/configs/
gemm-config.c``: f32 gemm 6 x 8 on aarch64 NEON-FMA). The tile must fit the register file:
``rows * vectors`` accumulators, ``vectors`` loaded rows of ``b`` and one broadcast.
"""
from __future__ import annotations

import functools
import os
import platform
import sys
import tempfile
from dataclasses import dataclass

import llvmlite.binding as llvm
import numba
from numba.core.registry import cpu_target

__all__ = ["Isa", "TILES", "ISA", "cpu", "has", "describe", "PROBED"]



def _llvm_knows(name: str) -> bool:
    """Whether LLVM knows the CPU ``name``: making a target machine for one it does not know,
    LLVM says "is not a recognized processor" on the process's stderr (read here through a
    temporary file in its place) and goes on for no CPU at all."""
    llvm.initialize_native_target()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)
        try:
            llvm.Target.from_default_triple().create_target_machine(cpu=name).target_data
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        return b"not a recognized processor" not in said.read()


if numba.config.CPU_NAME not in (None, "", "host") and numba.config.CPU_FEATURES is None \
        and "_toplevel_target_context" not in cpu_target.__dict__:
    if not _llvm_knows(numba.config.CPU_NAME):
        # with no features at all (not even 64-bit code) LLVM aborts the process at the first
        # compile, with no Python error ("64-bit code requested on a subtarget ...")
        raise ImportError(f"miniflow: NUMBA_CPU_NAME={numba.config.CPU_NAME!r} is not a CPU name "
                          f"LLVM knows: write one of its names, in lower case (haswell, "
                          f"skylake-avx512, znver3, x86-64-v3; `llc -mcpu=help` lists them), "
                          f"or unset it to compile for this machine", name=__name__)
    numba.config.CPU_FEATURES = ""      # the named CPU's own features (module docstring)


@dataclass(frozen=True)
class Isa:
    """One ISA's vector unit and matmul register tile.

    ``lanes``: float32 lanes of one vector; ``registers``: vector registers; ``rows`` x
    ``vectors``: the register tile of out (``rows`` rows by ``vectors * lanes`` columns) of
    ``matmul.outer_block_kernel``; ``packed``: ``(rows, vectors)`` of ``packed_gemm``'s tile,
    which broadcasts ``a`` from a packed panel (BLIS's micro-kernel)."""

    name: str
    lanes: int
    registers: int
    rows: int
    vectors: int
    source: str
    packed: tuple = (6, 2)

    @property
    def columns(self) -> int:
        """Columns of out one register tile spans (``vectors * lanes``)."""
        return self.vectors * self.lanes

    def registers_used(self) -> int:
        """Accumulators, loaded vectors of ``b`` and the broadcast of ``a``."""
        return self.rows * self.vectors + self.vectors + 1


TILES = {
    "avx512": Isa("avx512", 16, 32, 4, 4, "4 x 64 (16 zmm accumulators), measured on Zen 4; "
                  "BLIS skx sgemm 32 x 12 uses 24; packed 12 x 32 (24)", (12, 2)),
    "avx2": Isa("avx2", 8, 16, 6, 2, "6 x 16 (12 ymm accumulators), BLIS haswell sgemm 6 x 16"),
    "neon": Isa("neon", 4, 32, 6, 2, "6 x 8 (12 q-register accumulators), XNNPACK aarch64 "
                "neonfma 6 x 8"),
    "sse": Isa("sse", 4, 16, 6, 2, "6 x 8 (12 xmm accumulators): 4-lane vectors, 16 registers"),
}
"""ISA name -> :class:`Isa` (the table of ``STYLE``-guide BLIS/XNNPACK shapes, chosen once)."""

_PROBES = {
    "avx512f": ('define <16 x float> @probe(<16 x float> %x, <16 x float> %y) #0 {\n'
                '  %z = fadd <16 x float> %x, %y\n  ret <16 x float> %z\n}\n'
                'attributes #0 = { "min-legal-vector-width"="512" }\n', "zmm"),
    "avx": ('define <8 x float> @probe(<8 x float> %x, <8 x float> %y) {\n'
            '  %z = fadd <8 x float> %x, %y\n  ret <8 x float> %z\n}\n', "ymm"),
    "fma": ('declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)\n'
            'define <8 x float> @probe(<8 x float> %x, <8 x float> %y) {\n'
            '  %z = call <8 x float> @llvm.fma.v8f32(<8 x float> %x, <8 x float> %y, '
            '<8 x float> %x)\n  ret <8 x float> %z\n}\n', "vfmadd"),
    "f16c": ('define <8 x float> @probe(<8 x half> %x) {\n'
             '  %z = fpext <8 x half> %x to <8 x float>\n  ret <8 x float> %z\n}\n', "vcvtph2ps"),
    "avx512bf16": ('define <16 x bfloat> @probe(<16 x float> %x) #0 {\n'
                   '  %z = fptrunc <16 x float> %x to <16 x bfloat>\n  ret <16 x bfloat> %z\n}\n'
                   'attributes #0 = { "min-legal-vector-width"="512" }\n', "vcvtneps2bf16"),
}
PROBED = tuple(_PROBES)
"""The x86 features :func:`has` can answer (LLVM's names)."""


@functools.cache
def cpu() -> tuple:
    """``(triple, cpu name, feature string)`` Numba's CPU compiler was created with (its cache
    key, ``codegen().magic_tuple()``)."""
    return tuple(cpu_target.target_context.codegen().magic_tuple())


def _x86() -> bool:
    return cpu()[0].split("-")[0] in ("x86_64", "i386", "i686")


@functools.cache
def has(feature: str) -> bool:
    """Whether the CPU Numba compiles for has ``feature`` (one of :data:`PROBED`; see the module
    docstring). Non-x86 targets have none of them.

    Raises:
        ValueError: ``feature`` is not one :data:`PROBED` answers.
    """
    if feature not in _PROBES:
        raise ValueError(f"target.has: cannot probe {feature!r}; known: {', '.join(PROBED)}")
    if not _x86():
        return False
    triple, name, features = cpu()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu=name, features=features,
                                                                    opt=2)
    source, instruction = _PROBES[feature]
    module = llvm.parse_assembly(source)
    module.triple = triple
    return instruction in machine.emit_assembly(module)


def _isa() -> Isa:
    """The row of :data:`TILES` for the target: AVX-512F, AVX2 (FMA and 256-bit vectors), NEON on
    aarch64, else 4-lane vectors (SSE, or whatever LLVM makes of them)."""
    if _x86() and has("avx512f"):
        return TILES["avx512"]
    if _x86() and has("avx") and has("fma"):
        return TILES["avx2"]
    arch = cpu()[0].split("-")[0]
    return TILES["neon" if arch in ("aarch64", "arm64") else "sse"]


ISA = _isa()
"""The target's :class:`Isa` (read once, at import)."""


def describe() -> str:
    """One line: the target CPU, its ISA row and the probed features it has."""
    triple, name, features = cpu()
    given = "NUMBA_CPU_NAME" if numba.config.CPU_NAME else "host"
    found = [f for f in PROBED if has(f)]
    return (f"{name} ({given}; {triple}, {platform.machine()}): {ISA.name}, {ISA.lanes} float32 "
            f"lanes, {ISA.registers} registers, matmul tile {ISA.rows} x {ISA.columns}, packed "
            f"{ISA.packed[0]} x {ISA.packed[1] * ISA.lanes}; "
            f"features {', '.join(found) or 'none probed'}")
