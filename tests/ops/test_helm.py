"""The Helm chart: lints clean, renders valid Kubernetes objects for each kind of install, rejects bad values.

A real helm v4 comes offline from an npm package (tests/support/helm.py); every rendering is checked by
kubernetes-validate --strict against the API schemas of a current Kubernetes release.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.helm import CHART_DIR, render_chart, run_helm

KUBERNETES_VERSION = "1.35.0"  # the release of the helm build's client libraries
GPU_VALUES = CHART_DIR / "ci" / "gpu-values.yaml"
REPLICAS_VALUES = CHART_DIR / "ci" / "replicas-values.yaml"
TENSOR_PARALLEL_VALUES = CHART_DIR / "ci" / "tensor-parallel-values.yaml"
MONITORING_API = ("monitoring.coreos.com/v1",)
TLS_ON = ("tls.enabled=true", "tls.secretName=specd-tls")

RENDERINGS = {
    "default": {},
    "gpu-node": {"values_files": (GPU_VALUES,)},
    "replicas": {"values_files": (REPLICAS_VALUES,)},
    "tensor-parallel": {"values_files": (TENSOR_PARALLEL_VALUES,)},
    "tls": {"set_values": TLS_ON + ("apiKey.value=s3cret",)},
    "monitoring": {"api_versions": MONITORING_API},
}


def objects(manifest: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def pod_spec(docs: list[dict], component: str) -> dict:
    (workload,) = [w for w in workloads(docs) if w["metadata"]["name"] == f"specd-{component}"]
    return workload["spec"]["template"]["spec"]


def env_of(container: dict) -> dict:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return {name: render_chart(*options.get("values_files", ()), set_values=options.get("set_values", ()),
                               api_versions=options.get("api_versions", ()))
            for name, options in RENDERINGS.items()}


@pytest.mark.parametrize("values_files", [(), (GPU_VALUES,), (REPLICAS_VALUES,), (TENSOR_PARALLEL_VALUES,)],
                         ids=["default", "gpu-node", "replicas", "tensor-parallel"])
def test_chart_passes_strict_lint(values_files):
    result = run_helm("lint", "--strict", str(CHART_DIR), *[f"--values={path}" for path in values_files])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", RENDERINGS)
def test_rendering_is_valid_for_current_kubernetes(rendered, name, tmp_path):
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(rendered[name])
    validate = Path(sys.executable).parent / "kubernetes-validate"
    result = subprocess.run([str(validate), "--strict", "--kubernetes-version", KUBERNETES_VERSION, str(manifest)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every built-in kind was checked against a schema; only the Prometheus Operator's CRDs have none.
    checked = result.stdout.count("passed for resource")
    assert checked == len([d for d in objects(rendered[name]) if d["apiVersion"] != MONITORING_API[0]])


def test_monitoring_objects_only_when_cluster_serves_their_api(rendered):
    assert not find(objects(rendered["default"]), "ServiceMonitor")
    assert not find(objects(rendered["default"]), "PrometheusRule")
    docs = objects(rendered["monitoring"])
    (monitor,) = find(docs, "ServiceMonitor")
    (rule,) = find(docs, "PrometheusRule")
    rules_file = yaml.safe_load((CHART_DIR / "rules" / "specd-rules.yaml").read_text())
    assert rule["spec"] == {"groups": rules_file["groups"]}
    # Each service's /metrics port is named as an endpoint of the ServiceMonitor.
    endpoint_ports = {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]}
    for service, metrics_port in [("specd-gateway", 8000), ("specd-verifier-headless", 9461), ("specd-drafter", 9471)]:
        (svc,) = find(docs, "Service", service)
        names = {port["name"] for port in svc["spec"]["ports"] if port["port"] == metrics_port}
        assert names & endpoint_ports, service


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar(rendered):
    (dashboard,) = find(objects(rendered["default"]), "ConfigMap", "specd-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART_DIR / "dashboards" / "specd.json").read_text())
    assert json.loads(dashboard["data"]["specd.json"]) == shipped


def test_every_container_runs_non_root_read_only_without_capabilities(rendered):
    for name in RENDERINGS:
        for workload in workloads(objects(rendered[name])):
            spec = workload["spec"]["template"]["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for container in spec["containers"] + spec.get("initContainers", []):
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True
                assert context["allowPrivilegeEscalation"] is False
                assert context["capabilities"]["drop"] == ["ALL"]


def test_services_have_native_grpc_probes_on_their_grpc_port(rendered):
    docs = objects(rendered["default"])
    for component, port in [("gateway", 50051), ("verifier", 50061), ("drafter", 50071)]:
        (container,) = pod_spec(docs, component)["containers"]
        assert {"name": "grpc", "containerPort": port} in container["ports"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": port}, (component, probe)
    (verifier,) = pod_spec(docs, "verifier")["containers"]
    startup = verifier["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "model load and graph capture need minutes"


def test_tls_mounts_the_secret_and_wires_the_tls_options(rendered):
    docs = objects(rendered["tls"])
    for component in ("gateway", "verifier", "drafter"):
        spec = pod_spec(docs, component)
        (container,) = spec["containers"]
        env = env_of(container)
        assert (env["SPECD_TLS_CERT"], env["SPECD_TLS_KEY"], env["SPECD_TLS_CA"]) == (
            "/etc/specd/tls/tls.crt", "/etc/specd/tls/tls.key", "/etc/specd/tls/ca.crt")
        assert {"name": "tls", "secret": {"secretName": "specd-tls", "defaultMode": 0o440}} in spec["volumes"]
        # The kubelet's gRPC probe cannot speak TLS, so the probe runs the shipped health-check script.
        assert "/etc/specd/probe/grpc_health_probe.py" in container["readinessProbe"]["exec"]["command"]
    (probe_config,) = find(docs, "ConfigMap", "specd-probe")
    assert probe_config["data"]["grpc_health_probe.py"] == (CHART_DIR / "files" / "grpc_health_probe.py").read_text()


def test_api_key_secret_reaches_the_gateway_only(rendered):
    docs = objects(rendered["tls"])
    (secret,) = find(docs, "Secret", "specd-api-key")
    assert secret["data"]["api-key"] == "czNjcmV0"  # base64 of s3cret
    (gateway,) = pod_spec(docs, "gateway")["containers"]
    assert env_of(gateway)["SPECD_API_KEY"] == {"secretKeyRef": {"name": "specd-api-key", "key": "api-key"}}
    assert "SPECD_API_KEY" not in env_of(pod_spec(docs, "verifier")["containers"][0])


def test_gateway_dials_each_verifier_replica_through_the_headless_service(rendered):
    docs = objects(rendered["replicas"])
    (statefulset,) = find(docs, "StatefulSet", "specd-verifier")
    (headless,) = find(docs, "Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    (gateway,) = pod_spec(docs, "gateway")["containers"]
    addrs = [arg.split("=", 1)[1] for arg in gateway["args"] if arg.startswith("--verifier-addr=")]
    assert addrs == [f"specd-verifier-{i}.specd-verifier-headless.llm.svc:50061" for i in range(4)]
    (verifier,) = pod_spec(docs, "verifier")["containers"]
    assert env_of(verifier)["SPECD_DRAFTER_ADDR"] == "specd-drafter.llm.svc:50071"
    assert len(find(docs, "Deployment", "specd-drafter")) == 1
    assert find(docs, "HorizontalPodAutoscaler", "specd-gateway")


def test_the_drafters_memory_scope_and_size_come_from_values(rendered, tmp_path):
    (drafter,) = pod_spec(objects(rendered["default"]), "drafter")["containers"]
    assert env_of(drafter)["SPECD_DRAFT_MEMORY_SCOPE"] == "global"
    assert env_of(drafter)["SPECD_DRAFT_MEMORY_TOKENS"] == "1000000"
    assert env_of(drafter)["SPECD_DRAFT_MIN_PROBABILITY"] == "0.15"
    values = tmp_path / "drafter.yaml"  # a file: helm's --set reads 0.05 as a string
    values.write_text("drafter:\n  memoryScope: per-key\n  minDraftProbability: 0.05\n")
    per_key = objects(render_chart(values))
    (drafter,) = pod_spec(per_key, "drafter")["containers"]
    assert env_of(drafter)["SPECD_DRAFT_MEMORY_SCOPE"] == "per-key"
    assert env_of(drafter)["SPECD_DRAFT_MIN_PROBABILITY"] == "0.05"


def test_gpu_values_schedule_the_verifier_on_a_gpu_node(rendered):
    spec = pod_spec(objects(rendered["gpu-node"]), "verifier")
    (verifier,) = spec["containers"]
    assert verifier["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["model"]["hostPath"]["path"] == "/mnt/models"
    assert "initContainers" not in spec, "a mounted checkpoint needs no default-model preparation"


def test_tensor_parallel_size_sets_the_ranks_and_the_gpu_request_together(rendered):
    (verifier,) = pod_spec(objects(rendered["tensor-parallel"]), "verifier")["containers"]
    assert env_of(verifier)["SPECD_TENSOR_PARALLEL_SIZE"] == "4"
    assert verifier["resources"]["limits"]["nvidia.com/gpu"] == verifier["resources"]["requests"]["nvidia.com/gpu"] == 4
    (single,) = pod_spec(objects(rendered["gpu-node"]), "verifier")["containers"]
    assert env_of(single)["SPECD_TENSOR_PARALLEL_SIZE"] == "1"


def test_tensor_parallel_on_the_cpu_requests_no_gpu():
    docs = objects(render_chart(set_values=("verifier.tensorParallelSize=2", "verifier.gpus=0", "verifier.device=cpu")))
    (verifier,) = pod_spec(docs, "verifier")["containers"]
    assert env_of(verifier)["SPECD_TENSOR_PARALLEL_SIZE"] == "2"
    assert "nvidia.com/gpu" not in verifier["resources"].get("limits", {})


def test_default_model_is_prepared_by_an_init_container(rendered):
    docs = objects(rendered["default"])
    (config,) = find(docs, "ConfigMap", "specd-config")
    assert config["data"]["SPECD_MODEL"] == "default"
    for component in ("gateway", "verifier"):
        (init,) = pod_spec(docs, component)["initContainers"]
        assert init["command"] == ["python", "-m", "specd.default_model"]
        assert {"name": "specd-home", "mountPath": config["data"]["SPECD_HOME"]} in init["volumeMounts"]


def test_only_the_gateway_accepts_traffic_from_outside_the_release(rendered):
    policies = {p["metadata"]["name"]: p for p in find(objects(rendered["default"]), "NetworkPolicy")}
    assert "from" not in policies["specd-gateway"]["spec"]["ingress"][0]
    for name, peer, ports in [("specd-verifier", "gateway", ["grpc", "serve"]), ("specd-drafter", "verifier", ["grpc"])]:
        grpc_rule = policies[name]["spec"]["ingress"][0]
        assert grpc_rule["ports"] == [{"port": port} for port in ports]
        (source,) = grpc_rule["from"]
        assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == peer
        assert source["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "specd"


def test_the_verifiers_serve_socket_listens_on_the_port_the_policy_and_the_headless_service_name(rendered):
    (verifier,) = find(objects(rendered["default"]), "StatefulSet")
    container = verifier["spec"]["template"]["spec"]["containers"][0]
    serve_port = {p["name"]: p["containerPort"] for p in container["ports"]}["serve"]
    assert {e["name"]: e.get("value") for e in container["env"]}["SPECD_SERVE_PORT"] == str(serve_port)
    headless = [s for s in find(objects(rendered["default"]), "Service") if s["spec"].get("clusterIP") == "None"]
    assert {"name": "serve", "port": serve_port, "targetPort": "serve"} in headless[0]["spec"]["ports"]


@pytest.mark.parametrize("bad_value, field", [
    ("gateway.replicaCount=two", "/gateway/replicaCount"),
    ("verifier.device=tpu", "/verifier/device"),
    ("model.dtype=int4", "/model/dtype"),
    ("verifier.gpus=-1", "/verifier/gpus"),
    ("verifier.tensorParallelSize=0", "/verifier/tensorParallelSize"),
    ("verifier.tensorParallelSize=4,verifier.gpus=2", "verifier.gpus: 2 GPUs do not match verifier.tensorParallelSize 4"),
    ("replicaCount=2", "replicaCount"),  # a misplaced key is an error, not silently ignored
    ("tls.enabled=true", "/tls/secretName"),
    ("model.volume.type=pvc", "/model/volume/claimName"),
    ("drafter.memoryScope=tenant", "/drafter/memoryScope"),
    ("drafter.minDraftProbability=1.5", "/drafter/minDraftProbability"),
])
def test_bad_values_fail_naming_the_field(bad_value, field):
    result = run_helm("template", "specd", str(CHART_DIR), f"--set={bad_value}")
    assert result.returncode != 0
    assert field in result.stderr


def test_each_pod_outlives_its_services_drain(rendered):
    """Kubernetes kills a pod terminationGracePeriodSeconds after SIGTERM: the service's drain
    (SPECD_DRAIN_SECONDS) and its close-down must fit inside, or a rollout cuts live streams off."""
    for name in RENDERINGS:
        for workload in workloads(objects(rendered[name])):
            spec = workload["spec"]["template"]["spec"]
            (container,) = [c for c in spec["containers"] if "SPECD_DRAIN_SECONDS" in env_of(c)]
            drain = float(env_of(container)["SPECD_DRAIN_SECONDS"])
            assert spec["terminationGracePeriodSeconds"] == drain + 10, workload["metadata"]["name"]


@pytest.mark.parametrize("values, processes", [((), "1"), (("gateway.resources.requests.cpu=1500m",), "2"),
                                               (("gateway.resources.requests.cpu=4",), "4"),
                                               (("gateway.processes=3",), "3")])
def test_gateway_processes_come_from_the_value_else_the_cpu_request(values, processes):
    docs = objects(render_chart(set_values=values))
    (gateway,) = pod_spec(docs, "gateway")["containers"]
    assert env_of(gateway)["SPECD_GATEWAY_PROCESSES"] == processes


@pytest.mark.parametrize("values, interval", [((), "1"), (("gateway.streamInterval=8",), "8")])
def test_the_gateway_stream_interval_comes_from_its_value(values, interval):
    (gateway,) = pod_spec(objects(render_chart(set_values=values)), "gateway")["containers"]
    assert env_of(gateway)["SPECD_STREAM_INTERVAL"] == interval
