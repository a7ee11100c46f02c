"""gRPC servicer methods of the schema registry (RegisterSchema, GetSchema, ListSchemas,
DeleteSchemas, TestSchemaCompatibility, SchemaCompatibility): check the caller, then answer with
the handler's registry (`schema_codec.serve`): the controller's own, or a broker's, which
forwards every call to the controller.

With an authorizer, reading the registry needs DESCRIBE on the cluster and changing it
(registering, deleting, setting a level) ALTER on the cluster. Confluent guards its registry with
its own role bindings; deltabus uses the cluster's ACLs so one set of grants covers both.
"""

from __future__ import annotations

from typing import Any

from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler
from deltabus.rpc import status
from deltabus.rpc.access import Access
from deltabus.rpc.schema_codec import serve
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.security.acls import Operation


class SchemaServicerMixin:
    """The schema registry calls of `DeltaBusServicer`."""

    _handler: DeltaBusHandler

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def _serve(self, method: str, request: Any, context: Any, operation: Operation) -> Any:
        """The registry's answer; a refused caller, or a controller that could not be asked,
        gets the gRPC status of its Kafka error, as every other call."""
        try:
            Access.raise_if(self._access(context).cluster(operation))
            return serve(self._handler.schema_registry, method, request)
        except errors.DeltaBusError as e:
            status.abort(context, e)

    def RegisterSchema(self, request: pb.RegisterSchemaRequest,
                       context: Any) -> pb.SchemaResponse:
        operation = Operation.DESCRIBE if request.lookup_only else Operation.ALTER
        return self._serve("RegisterSchema", request, context, operation)

    def GetSchema(self, request: pb.GetSchemaRequest, context: Any) -> pb.SchemaResponse:
        return self._serve("GetSchema", request, context, Operation.DESCRIBE)

    def ListSchemas(self, request: pb.ListSchemasRequest, context: Any) -> pb.ListSchemasResponse:
        return self._serve("ListSchemas", request, context, Operation.DESCRIBE)

    def DeleteSchemas(self, request: pb.DeleteSchemasRequest,
                      context: Any) -> pb.DeleteSchemasResponse:
        return self._serve("DeleteSchemas", request, context, Operation.ALTER)

    def TestSchemaCompatibility(self, request: pb.TestSchemaCompatibilityRequest,
                                context: Any) -> pb.TestSchemaCompatibilityResponse:
        return self._serve("TestSchemaCompatibility", request, context, Operation.DESCRIBE)

    def SchemaCompatibility(self, request: pb.SchemaCompatibilityRequest,
                            context: Any) -> pb.SchemaCompatibilityResponse:
        changes = request.remove or request.HasField("level")
        return self._serve("SchemaCompatibility", request, context,
                           Operation.ALTER if changes else Operation.DESCRIBE)
