"""Tiled matmul programs: C (int32, M x N) = A (int8, M x K) @ B (int8, K x N), row-major."""
from dataclasses import dataclass

from .program import Deps, Dim, Program, tensor

__all__ = ["MatmulPlan", "compile_matmul", "plan_matmul"]


@dataclass(frozen=True)
class MatmulPlan:
    """How a matmul is tiled on a core: all derived from the config and the shape."""
    m: int
    k: int
    n: int
    m_tile: int
    """Activation vectors per MATMUL: rows of A and accumulator rows per output tile."""
    buffer_rows: int
    """Scratchpad rows of one of the two (ping-pong) load buffers."""

    @property
    def k_tiles(self):
        return -(-self.k // self.rows)

    rows: int = 1
    cols: int = 1

    @property
    def n_tiles(self):
        return -(-self.n // self.cols)

    @property
    def m_tiles(self):
        return -(-self.m // self.m_tile)


def plan_matmul(config, m, k, n):
    for name, value in (("M", m), ("K", k), ("N", n)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
    buffer_rows = config.scratchpad_rows // 2
    m_tile = min(m, config.accumulator_rows // 2, buffer_rows - config.rows, 0xFFFF)
    if m_tile < 1:
        raise ValueError("the scratchpad is too small for one weight tile and one activation row")
    return MatmulPlan(m=m, k=k, n=n, m_tile=m_tile, buffer_rows=buffer_rows,
                      rows=config.rows, cols=config.cols)


def compile_matmul(config, m, k, n, *, a_addr, b_addr, c_addr):
    """A program for one matmul, double buffered in the scratchpad and in the accumulator.

    Steps run over (output tile, k tile); the loads of step i+1 overlap the MATMUL of step i,
    and the STORE of output tile j overlaps the work on tile j+1. Tokens: load -> execute when a
    buffer is filled, execute -> load when it may be refilled, execute -> store when an output
    tile is complete, store -> execute when its accumulator half may be reused.
    """
    plan = plan_matmul(config, m, k, n)
    rows, cols = config.rows, config.cols
    program = Program()
    outputs = [(mt, nt) for mt in range(plan.m_tiles) for nt in range(plan.n_tiles)]
    steps = len(outputs) * plan.k_tiles
    step = 0
    for j, (mt, nt) in enumerate(outputs):
        m0, n0 = mt * plan.m_tile, nt * cols
        m_count = min(plan.m_tile, m - m0)
        acc_row = (j % 2) * (config.accumulator_rows // 2)
        for kt in range(plan.k_tiles):
            k0 = kt * rows
            buffer = (step % 2) * plan.buffer_rows
            weight_row, act_row = buffer, buffer + rows
            program.load(tensor(b_addr, 1, weight_row, [
                Dim(extent=cols, start=n0, bound=n, stride=1),
                Dim(extent=rows, start=k0, bound=k, stride=n)]),
                Deps(pop_next=step >= 2))
            program.load(tensor(a_addr, 1, act_row, [
                Dim(extent=rows, start=k0, bound=k, stride=1),
                Dim(extent=m_count, start=m0, bound=m, stride=k)]),
                Deps(push_next=True))
            first, last = kt == 0, kt == plan.k_tiles - 1
            program.matmul(weight_row, act_row, acc_row, m_count, accumulate=not first,
                           deps=Deps(pop_prev=True, pop_next=first and j >= 2,
                                     push_prev=step + 2 < steps, push_next=last))
            step += 1
        program.store(tensor(c_addr, 4, acc_row, [
            Dim(extent=cols, start=n0, bound=n, stride=4),
            Dim(extent=m_count, start=m0, bound=m, stride=4 * n)]),
            Deps(pop_prev=True, push_prev=j + 2 < len(outputs)))
    program.end()
    return program
