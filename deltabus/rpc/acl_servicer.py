"""gRPC servicer methods of the ACL calls (Kafka's CreateAcls, DescribeAcls, DeleteAcls): decode,
call the request layer, encode.

The checks are the request layer's (rpc/admin_requests.py CLUSTER_ACTIONS, Kafka's): Create
and Delete need ALTER on the cluster, Describe DESCRIBE; a refused Create or Delete answers
every creation or filter with CLUSTER_AUTHORIZATION_FAILED and changes nothing, a refused
Describe carries it as the response's error. A broker forwards Create and
Delete to the controller on the caller's behalf and answers Describe from its own metadata.
"""

from __future__ import annotations

from typing import Any

from deltabus import errors
from deltabus.rpc import codec, status
from deltabus.rpc.access import Access
from deltabus.rpc.request_layer import RequestLayer
from deltabus.rpc.v1 import deltabus_pb2 as pb


class AclServicerMixin:
    """The ACL calls of `DeltaBusServicer`."""

    _requests: RequestLayer

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def CreateAcls(self, request: pb.CreateAclsRequest, context: Any) -> pb.CreateAclsResponse:
        access = self._access(context)
        refusal = self._requests.admin.cluster_refusal(access, "CreateAcls")
        if refusal is not None:
            return codec.create_acls_response([refusal for _ in request.creations])
        creations = [codec.acl_creation_from_proto(c) for c in request.creations]
        try:
            return codec.create_acls_response(self._requests.admin.create_acls(access, creations))
        except errors.DeltaBusError as e:  # the controller could not be asked
            status.abort(context, e)

    def DescribeAcls(self, request: pb.DescribeAclsRequest,
                     context: Any) -> pb.DescribeAclsResponse:
        access = self._access(context)
        refusal = self._requests.admin.cluster_refusal(access, "DescribeAcls")
        if refusal is not None:
            return codec.describe_acls_response(refusal)
        try:
            return codec.describe_acls_response(self._requests.admin.describe_acls(
                access, codec.acl_filter_from_proto(request.filter)))
        except errors.InvalidRequestError as e:
            return codec.describe_acls_response(e)

    def DeleteAcls(self, request: pb.DeleteAclsRequest, context: Any) -> pb.DeleteAclsResponse:
        access = self._access(context)
        refusal = self._requests.admin.cluster_refusal(access, "DeleteAcls")
        if refusal is not None:
            return codec.delete_acls_response([refusal for _ in request.filters])
        filters = [codec.acl_filter_from_proto(f) for f in request.filters]
        try:
            return codec.delete_acls_response(self._requests.admin.delete_acls(access, filters))
        except errors.DeltaBusError as e:
            status.abort(context, e)
