"""Shared options: command line over SPECD_* environment over defaults; bad values name the option."""
import pytest

from specd_cli.main import build_parser
from specd_cli.launcher import plan_stack
from specd.options import ServiceOptions, options_from_args
from verifier_service.config import verifier_config_from_options


def parse(argv, monkeypatch=None, **env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return options_from_args(build_parser().parse_args(argv))


def test_defaults_follow_the_contract():
    options = parse(["gateway"])
    assert options.model == "default"
    assert options.verifier_addresses == ("127.0.0.1:50061",)
    assert options.drafter_addr == "127.0.0.1:50071"


def test_environment_supplies_options(monkeypatch):
    options = parse(["verifier"], monkeypatch, SPECD_MODEL="/models/x", SPECD_NUM_SPECULATIVE_TOKENS="0",
                    SPECD_VERIFIER_ADDR="a:1,b:2")
    assert options.model == "/models/x"
    assert options.num_speculative_tokens == 0
    assert options.verifier_addrs == ("a:1", "b:2")


def test_command_line_wins_over_environment(monkeypatch):
    options = parse(["verifier", "--model", "/cli"], monkeypatch, SPECD_MODEL="/env")
    assert options.model == "/cli"


def test_repeated_verifier_addr_collects_all():
    options = parse(["gateway", "--verifier-addr", "h:1", "--verifier-addr", "h:2"])
    assert options.verifier_addresses == ("h:1", "h:2")


def test_auto_on_a_cpu_machine_means_float32_cpu():
    options = ServiceOptions()
    assert options.resolved_device() in ("cpu", "cuda")
    assert options.resolved_dtype() == ("bfloat16" if options.resolved_device() == "cuda" else "float32")


@pytest.mark.parametrize("argv, env, expected", [([], {}, None), (["--async-scheduling", "on"], {}, True),
                                                  ([], {"SPECD_ASYNC_SCHEDULING": "off"}, False)])
def test_async_scheduling_reaches_the_engine_config(monkeypatch, argv, env, expected):
    options = parse(["verifier", "--device", "cpu", *argv], monkeypatch, **env)
    assert verifier_config_from_options(options).engine.async_scheduling is expected  # None = auto (CUDA only)
    up = parse(["up", *argv], monkeypatch, **env)
    verifier = next(s for s in plan_stack(up, num_verifiers=1, port_offset=0) if s.name.startswith("verifier"))
    assert verifier.argv[verifier.argv.index("--async-scheduling") + 1] == up.async_scheduling


@pytest.mark.parametrize("argv, env, expected", [([], {}, False), (["--draft-policy", "goodput"], {}, True),
                                                  ([], {"SPECD_DRAFT_POLICY": "goodput"}, True)])
def test_the_draft_policy_reaches_the_engine_config_and_up_forwards_it(monkeypatch, argv, env, expected):
    options = parse(["verifier", "--device", "cpu", *argv], monkeypatch, **env)
    assert verifier_config_from_options(options).engine.draft_goodput is expected
    up = parse(["up", *argv], monkeypatch, **env)
    verifier = next(s for s in plan_stack(up, num_verifiers=1, port_offset=0) if s.name.startswith("verifier"))
    assert verifier.argv[verifier.argv.index("--draft-policy") + 1] == up.draft_policy


@pytest.mark.parametrize("argv, env, expected", [([], {}, 8), (["--max-speculative-tokens", "12"], {}, 12),
                                                  ([], {"SPECD_MAX_SPECULATIVE_TOKENS": "6"}, 6),
                                                  (["--num-speculative-tokens", "10"], {}, 10)])
def test_max_speculative_tokens_reaches_the_engine_config(monkeypatch, argv, env, expected):
    options = parse(["verifier", "--device", "cpu", *argv], monkeypatch, **env)
    assert verifier_config_from_options(options).engine.speculative_tokens_limit == expected


# docs/BENCHMARKS_ARCHIVE.md, "The CPU default for k"
@pytest.mark.parametrize("device, expected", [("cpu", 6), ("cuda", 4)])
def test_unset_num_speculative_tokens_takes_the_device_default(device, expected):
    options = parse(["verifier", "--device", device])
    assert options.num_speculative_tokens is None
    assert options.resolved_num_speculative_tokens() == expected


def test_the_device_default_for_k_stays_within_max_speculative_tokens():
    options = parse(["verifier", "--device", "cpu", "--max-speculative-tokens", "3"])
    assert verifier_config_from_options(options).engine.num_speculative_tokens == 3


def test_an_explicit_k_wins_over_the_device_default(monkeypatch):
    options = parse(["verifier", "--device", "cpu"], monkeypatch, SPECD_NUM_SPECULATIVE_TOKENS="2")
    assert verifier_config_from_options(options).engine.num_speculative_tokens == 2


def test_up_leaves_an_unset_k_to_each_verifier():
    services = plan_stack(ServiceOptions(), num_verifiers=1, port_offset=0)
    assert all("--num-speculative-tokens" not in s.argv for s in services)
    services = plan_stack(ServiceOptions(num_speculative_tokens=0), num_verifiers=1, port_offset=0)
    verifier = next(s for s in services if s.name == "verifier")
    assert verifier.argv[verifier.argv.index("--num-speculative-tokens") + 1] == "0"


@pytest.mark.parametrize("argv, env, expected", [([], {}, 1), (["--tensor-parallel-size", "4"], {}, 4),
                                                  ([], {"SPECD_TENSOR_PARALLEL_SIZE": "2"}, 2)])
def test_tensor_parallel_size_reaches_the_engine_config(monkeypatch, argv, env, expected):
    options = parse(["verifier", "--device", "cpu", *argv], monkeypatch, **env)
    assert verifier_config_from_options(options).engine.tensor_parallel_size == expected


def test_up_gives_every_verifier_replica_the_tensor_parallel_size():
    services = plan_stack(ServiceOptions(tensor_parallel_size=2), num_verifiers=2, port_offset=0)
    for verifier in (s for s in services if s.name.startswith("verifier")):
        assert verifier.argv[verifier.argv.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize("field, kwargs", [("num_speculative_tokens", {"num_speculative_tokens": -1}),
                                           ("max_speculative_tokens", {"num_speculative_tokens": 4,
                                                                       "max_speculative_tokens": 3}),
                                           ("max_speculative_tokens", {"max_speculative_tokens": 33}),
                                           ("device", {"device": "tpu"}),
                                           ("tensor_parallel_size", {"tensor_parallel_size": 0}),
                                           ("async_scheduling", {"async_scheduling": "yes"}),
                                           ("draft_policy", {"draft_policy": "always"}),
                                           ("tls_cert", {"tls_cert": "c.pem"})])
def test_bad_values_name_the_option(field, kwargs):
    with pytest.raises(ValueError, match=field):
        ServiceOptions(**kwargs)


def test_port_offset_moves_every_service_and_replicas_get_consecutive_ports():
    services = plan_stack(ServiceOptions(), num_verifiers=2, port_offset=100)
    ports = {s.name: s.grpc_port for s in services}
    assert ports == {"drafter": 50171, "verifier-0": 50161, "verifier-1": 50162, "gateway": 50151}
    gateway = services[-1].argv
    assert gateway[gateway.index("--http-port") + 1] == "8100"
    assert "127.0.0.1:50162" in gateway


def test_too_many_verifiers_is_refused():
    with pytest.raises(ValueError, match="num_verifiers"):
        plan_stack(ServiceOptions(), num_verifiers=11, port_offset=0)


@pytest.mark.parametrize("argv, env, scope", [([], {}, "global"), (["--draft-memory-scope", "per-key"], {}, "per-key"),
                                              ([], {"SPECD_DRAFT_MEMORY_SCOPE": "off"}, "off")])
def test_the_draft_memory_scope_reaches_the_drafter_config(monkeypatch, argv, env, scope):
    from drafter_service.config import drafter_config_from_options

    assert drafter_config_from_options(parse(["drafter", *argv], monkeypatch, **env)).memory_scope == scope


def test_drafter_memory_options_reach_its_config_and_up_forwards_them(monkeypatch):
    from drafter_service.config import drafter_config_from_options

    options = parse(["up", "--draft-memory-scope", "per-key", "--draft-min-probability", "0.4"], monkeypatch,
                    SPECD_DRAFT_MEMORY_TOKENS="5000", SPECD_DRAFTING="ngram")
    config = drafter_config_from_options(options)
    assert (config.memory_scope, config.max_memory_tokens, config.min_draft_probability, config.drafting) == (
        "per-key", 5000, 0.4, "ngram")
    drafter = plan_stack(options, num_verifiers=1, port_offset=0)[0]
    assert drafter.name == "drafter"
    assert drafter.argv[drafter.argv.index("--draft-memory-scope") + 1] == "per-key"
    assert drafter.argv[drafter.argv.index("--draft-min-probability") + 1] == "0.4"


def test_an_unknown_draft_memory_scope_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="draft_memory_scope"):
        ServiceOptions(draft_memory_scope="tenant")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["drafter", "--draft-memory-scope", "tenant"])


def _omp_wait_policy_of_a_service(env: dict) -> str:
    """What torch's OpenMP runtime is told in a process that runs the specd CLI (as every service does)."""
    import os
    import subprocess
    import sys

    code = "import specd_cli.main, os, torch; print(os.environ['OMP_WAIT_POLICY'])"
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_services_let_idle_openmp_threads_sleep_rather_than_spin():
    assert _omp_wait_policy_of_a_service({}) == "PASSIVE"


def test_an_operators_openmp_wait_policy_wins():
    assert _omp_wait_policy_of_a_service({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
