"""Floors import downward only: the base imports no service, services see each other only through
the protos, the verifier's folders import one way and no files import each other in a circle."""
from __future__ import annotations

from architecture.imports_graph import SERVICES, cycles, import_graph

# Folder pairs inside verifier_service/ that still import each other (none since the sharded model moved to
# sharding/, below the runner, and build_model_runner to runners.py, above engine/ and parallel/). Only shrinks.
KNOWN_FOLDER_PAIRS: set[tuple[str, str]] = set()


def _edges(graph, source_prefix, target_prefix):
    return sorted((module, target) for module, targets in graph.items() if module.startswith(source_prefix)
                  for target in targets if target.startswith(target_prefix))


def _verifier_folder_pairs(graph) -> set[tuple[str, str]]:
    arrows = {(module.split(".")[1], target.split(".")[1]) for module, targets in graph.items()
              for target in targets if module.count(".") > 1 and target.count(".") > 1
              and module.startswith("verifier_service.") and target.startswith("verifier_service.")}
    return {(a, b) for a, b in arrows if a < b and (b, a) in arrows}


def test_the_base_imports_no_service():
    graph = import_graph()
    assert [edge for service in SERVICES for edge in _edges(graph, "specd.", service)] == []


def test_only_the_entry_points_import_the_services_from_outside():
    graph = import_graph()
    outside = [edge for service in SERVICES for edge in _edges(graph, "specd_cli", service)]
    assert outside, "specd_cli/ starts the services"


def test_the_drafter_and_the_gateway_import_nothing_of_the_verifier():
    graph = import_graph()
    assert _edges(graph, "drafter_service", "verifier_service") == []
    assert _edges(graph, "gateway", "verifier_service") == []


def test_no_folder_pair_inside_the_verifier_imports_each_other_beyond_the_known_ones():
    pairs = _verifier_folder_pairs(import_graph())
    assert pairs - KNOWN_FOLDER_PAIRS == set()
    assert KNOWN_FOLDER_PAIRS - pairs == set(), "a pair was untangled: take it off KNOWN_FOLDER_PAIRS"


def test_no_modules_import_each_other_in_a_circle():
    assert cycles(import_graph()) == []
