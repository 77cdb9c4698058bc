"""SPECD_FEW_ROW_GEMMS's decompositions (verifier_service/model/compile.py): a linear of a few rows, traced as
Inductor traces a compiled region, has no aten GEMM left in it: under "triton" it calls the fixed-tile Triton GEMM's
operator (torch.ops.specd.few_rows_mm, bias included), under "reductions" a multiply-and-sum with the GEMM's values.
More rows keep their GEMMs. A region compiled dynamic in its rows (batched steps) compiles once for each side of the
Triton GEMM's row limit and calls the operator on the few-row side only."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from verifier_service.model import compile as compile_module
from verifier_service.model.compile import REDUCTION_ROWS_MAX, TRITON_ROWS_MAX, few_rows_decompositions

LIMITS = {"triton": TRITON_ROWS_MAX, "reductions": REDUCTION_ROWS_MAX}


def projections(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """A biased projection (Qwen2's qkv) and a plain one, as a layer region calls them."""
    return torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, w1, b1)), w2)


def traced(rows: int, kind: str, mode: str = "real") -> tuple[list[str], torch.fx.GraphModule, tuple]:
    generator = torch.Generator().manual_seed(rows)
    shapes = [(rows, 64), (96, 64), (96,), (32, 96)]
    inputs = tuple(torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes)
    graph = make_fx(projections, decomposition_table=few_rows_decompositions(kind), tracing_mode=mode)(*inputs)
    ops = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    return ops, graph, inputs


@pytest.mark.parametrize("rows", [2, 5, 16, TRITON_ROWS_MAX])
def test_a_few_rows_call_the_triton_gemm_for_each_projection(rows):
    ops, graph, _ = traced(rows, "triton", mode="fake")  # fake: the operator itself runs on CUDA only
    assert ops.count("specd.few_rows_mm.default") == 2, ops
    assert not {op for op in ops if op.startswith("aten.") and "mm" in op}, ops
    biased = next(node for node in graph.graph.nodes if str(node.target) == "specd.few_rows_mm.default")
    assert len(biased.args) == 3  # the bias goes into the kernel, not into an add after it


@pytest.mark.parametrize("rows", [2, 5, 9])
def test_a_few_rows_trace_to_reductions_with_the_gemms_values(rows):
    ops, graph, inputs = traced(rows, "reductions")
    assert not {op for op in ops if "mm" in op}, ops
    assert "aten.sum.dim_IntList" in ops
    torch.testing.assert_close(graph(*inputs), projections(*inputs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["triton", "reductions"])
def test_more_rows_keep_their_gemms(kind):
    ops, graph, inputs = traced(LIMITS[kind] + 1, kind)
    assert {"aten.mm.default", "aten.addmm.default"} <= set(ops), ops
    torch.testing.assert_close(graph(*inputs), projections(*inputs))


@pytest.mark.parametrize("rows, expected", [(TRITON_ROWS_MAX, "specd.few_rows_mm.default"),
                                            (TRITON_ROWS_MAX + 16, "aten.mm.default")])
def test_symbolic_rows_take_the_side_of_the_limit_they_lie_on(rows, expected):
    ops, _, _ = traced(rows, "triton", mode="symbolic")
    assert expected in ops, ops


@pytest.fixture
def cpu_few_rows_mm():
    """The operator on the CPU (its kernel is CUDA's), counting its calls: torch.mm's values, (+ bias)."""
    from verifier_service.kernels import linear_op

    calls = []

    def on_cpu(a, b, bias=None):
        calls.append(a.shape[0])
        return a @ b if bias is None else torch.addmm(bias, a, b)
    linear_op.few_rows_mm.register_kernel("cpu")(on_cpu)
    yield calls
    linear_op.few_rows_mm._backend_fns.pop("cpu", None)


def test_a_dynamic_region_compiles_once_a_side_and_calls_the_operator_on_the_few_rows_side(cpu_few_rows_mm):
    import torch._dynamo.testing

    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape, generator=generator) for shape in ((96, 64), (96,), (32, 96))]
    counter = torch._dynamo.testing.CompileCounterWithBackend(
        compile_module._few_rows_backend("triton", (("triton.enable_pdl", False),)))
    region = torch.compile(lambda x: projections(x, *weights), dynamic=True, fullgraph=True, backend=counter)
    for rows in (3, 40, TRITON_ROWS_MAX, TRITON_ROWS_MAX + 1, 200, 7):
        x = torch.randn(rows, 64, generator=generator)
        cpu_few_rows_mm.clear()
        torch.testing.assert_close(region(x), projections(x, *weights))
        assert cpu_few_rows_mm == ([rows, rows] if rows <= TRITON_ROWS_MAX else []), rows
    assert counter.frame_count == 2  # once for each side of the limit: no compile per row count
    torch._dynamo.reset()


def test_an_unknown_kind_is_refused_naming_the_variable(monkeypatch):
    from specd import environment

    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS", "cutlass")
    with pytest.raises(ValueError, match="SPECD_FEW_ROW_GEMMS"):
        environment.few_row_gemms(default="cublas")


def test_the_variable_overrides_the_default(monkeypatch):
    from specd import environment

    monkeypatch.delenv("SPECD_FEW_ROW_GEMMS", raising=False)
    assert environment.few_row_gemms(default="triton") == "triton"
    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS", "cublas")
    assert environment.few_row_gemms(default="triton") == "cublas"



@pytest.mark.parametrize("pdl_on, sharded, expected", [(True, False, "triton"), (True, True, "cublas"),
                                                       (False, False, "cublas")])
def test_the_default_is_triton_where_pdl_is_on_for_one_gpu(monkeypatch, pdl_on, sharded, expected):
    from verifier_service.model import compile as compile_module

    monkeypatch.delenv("SPECD_FEW_ROW_GEMMS", raising=False)
    monkeypatch.setattr(compile_module.pdl, "enabled", lambda device: pdl_on)
    assert compile_module.few_row_kind(torch.device("cpu"), sharded) == expected
    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS", "reductions")
    assert compile_module.few_row_kind(torch.device("cpu"), sharded) == "reductions"


@pytest.mark.parametrize("rows, expected", [(96, "specd.few_rows_mm.default"), (97, "aten.mm.default")])
def test_the_row_limit_follows_its_variable(monkeypatch, rows, expected):
    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS_MAX_ROWS", "96")  # not the default (TRITON_ROWS_MAX)
    assert TRITON_ROWS_MAX != 96
    ops, _, _ = traced(rows, "triton", mode="fake")
    assert expected in ops, ops
    ops, _, _ = traced(REDUCTION_ROWS_MAX + 1, "reductions")  # reductions keep their own limit
    assert "aten.mm.default" in ops, ops


@pytest.mark.parametrize("value", ["0", "257", "64.5", "many"])
def test_a_row_limit_out_of_range_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS_MAX_ROWS", value)
    with pytest.raises(ValueError, match="SPECD_FEW_ROW_GEMMS_MAX_ROWS"):
        few_rows_decompositions("triton")


def test_the_k_split_setting_defaults_to_whole_k_and_refuses_others_naming_the_variable(monkeypatch):
    from specd import environment

    monkeypatch.delenv("SPECD_FEW_ROW_GEMMS_SPLIT_K", raising=False)
    assert environment.few_row_gemms_split_k() == "0"
    for value in ("0", "1", "tile"):
        monkeypatch.setenv("SPECD_FEW_ROW_GEMMS_SPLIT_K", value)
        assert environment.few_row_gemms_split_k() == value
    monkeypatch.setenv("SPECD_FEW_ROW_GEMMS_SPLIT_K", "yes")
    with pytest.raises(ValueError, match="SPECD_FEW_ROW_GEMMS_SPLIT_K"):
        environment.few_row_gemms_split_k()


def test_the_deterministic_gemm_setting_defaults_to_auto_and_refuses_others_naming_the_variable(monkeypatch):
    from specd import environment

    monkeypatch.delenv("SPECD_DETERMINISTIC_GEMMS", raising=False)
    assert environment.deterministic_gemms() == "auto"
    for value in ("auto", "cublas", "triton", "triton-split"):
        monkeypatch.setenv("SPECD_DETERMINISTIC_GEMMS", value)
        assert environment.deterministic_gemms() == value
    monkeypatch.setenv("SPECD_DETERMINISTIC_GEMMS", "cutlass")
    with pytest.raises(ValueError, match="SPECD_DETERMINISTIC_GEMMS"):
        environment.deterministic_gemms()
