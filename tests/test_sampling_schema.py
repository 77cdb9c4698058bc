"""specd/sampling.py is the one schema of a request's sampling parameters; the protos are its wire form. These
tests pin the two to each other, both ways, so a field added to one and not the other fails here."""
import collections.abc
import dataclasses
import typing

import pytest
from google.protobuf.descriptor import FieldDescriptor

from specd import sampling
from specd.v1 import common_pb2, gateway_pb2, verifier_pb2

_INTEGERS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_INT64,
             FieldDescriptor.TYPE_UINT64}
_KINDS = {FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_DOUBLE: "float", FieldDescriptor.TYPE_BOOL: "bool",
          FieldDescriptor.TYPE_STRING: "str", FieldDescriptor.TYPE_ENUM: "str"}  # enums carry named modes
# GenerateRequest's fields that are the gateway's own: tokenized or matched there, never sent on.
_GATEWAY_ONLY = {"prompt", "prompt_token_ids", "stop"}
_SCHEMA = {field.name: field for field in dataclasses.fields(sampling.SamplingParams)}
_HINTS = typing.get_type_hints(sampling.SamplingParams)


def _schema_kind(name: str) -> tuple[str, bool]:
    """(kind, optional) of a schema field: its value type as the wire sees it, and whether None is allowed."""
    hint = _HINTS[name]
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    optional = type(None) in typing.get_args(hint)
    if optional:
        hint = args[0]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return f"repeated {typing.get_args(hint)[0].__name__}", optional
    if origin is not None and issubclass(origin, collections.abc.Mapping):
        key, value = typing.get_args(hint)
        return f"map {key.__name__} {value.__name__}", optional
    return hint.__name__, optional


def _proto_kind(field: FieldDescriptor) -> str:
    """A proto field's kind in the schema's terms: every integer width is an int (non-negative values cross)."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type.fields_by_name
        return f"map {_scalar(entry['key'])} {_scalar(entry['value'])}"
    if field.is_repeated:
        return f"repeated {_scalar(field)}"
    return _scalar(field)


def _scalar(field: FieldDescriptor) -> str:
    return "int" if field.type in _INTEGERS else _KINDS[field.type]


def _carriers() -> list[tuple[str, object, tuple[str, ...]]]:
    """(what, message descriptor, schema fields it carries): all but the engine's own in the verifier's
    SamplingParams, the tenant key beside it, and what a client may set in the gateway's GenerateRequest."""
    return [("common.SamplingParams", common_pb2.SamplingParams.DESCRIPTOR, sampling.WIRE_FIELDS),
            ("verifier.VerifierGenerateRequest", verifier_pb2.VerifierGenerateRequest.DESCRIPTOR,
             sampling.REQUEST_FIELDS),
            ("gateway.GenerateRequest", gateway_pb2.GenerateRequest.DESCRIPTOR, sampling.CLIENT_FIELDS)]


@pytest.mark.parametrize("what, message, names", _carriers(), ids=[carrier[0] for carrier in _carriers()])
def test_every_schema_field_has_its_proto_field_of_a_compatible_type(what, message, names):
    for name in names:
        assert name in message.fields_by_name, f"{what} lacks the schema's {name}"
        field = message.fields_by_name[name]
        kind, optional = _schema_kind(name)
        assert _proto_kind(field) == kind, f"{what}.{name} is {_proto_kind(field)}, the schema's is {kind}"
        assert field.has_presence or not optional, f"{what}.{name} must be `optional`: None means unset"


def test_every_sampling_proto_field_is_a_schema_field():
    sampling_fields = set(common_pb2.SamplingParams.DESCRIPTOR.fields_by_name)
    assert sampling_fields <= set(_SCHEMA), f"not in specd/sampling.py: {sampling_fields - set(_SCHEMA)}"
    client_fields = set(gateway_pb2.GenerateRequest.DESCRIPTOR.fields_by_name) - _GATEWAY_ONLY
    assert client_fields == set(sampling.CLIENT_FIELDS)


def test_the_schemas_field_groups_name_schema_fields():
    assert set(sampling.WIRE_FIELDS + sampling.ENGINE_ONLY_FIELDS + sampling.REQUEST_FIELDS) == set(_SCHEMA)
    assert set(sampling.CLIENT_FIELDS) <= set(sampling.WIRE_FIELDS)
