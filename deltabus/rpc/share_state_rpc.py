"""`__share_group_state` over the internal API: the driver's `ShareGroupState` servicer, over
its share state store, and the leaders' client of it, with the store's own interface
(`claim`, `write`, `alter`, each a future), so a broker's SharePartitionManager cannot tell the
two apart. Kafka's leaders call the share coordinator's ReadShareGroupState and
WriteShareGroupState the same way."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import grpc

from deltabus import errors
from deltabus.config import ListenerSecurity
from deltabus.offsets.share_state_store import ShareState, ShareStateStore, StateBatch
from deltabus.rpc.channel import open_channel
from deltabus.rpc.inter_broker import credential_metadata
from deltabus.rpc.status import abort
from deltabus.rpc.tls import grpc_peer_credentials
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc

STATE_CALL_TIMEOUT_S = 30.0


def to_snapshot(state: ShareState) -> ipb.ShareGroupStateSnapshot:
    return ipb.ShareGroupStateSnapshot(
        group_id=state.group_id, topic=state.topic, partition=state.partition,
        start_offset=state.start_offset, state_epoch=state.state_epoch,
        leader_epoch=state.leader_epoch, batches=[
            ipb.ShareStateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                delivery_state=b.delivery_state, delivery_count=b.delivery_count)
            for b in state.batches])


def from_snapshot(m: ipb.ShareGroupStateSnapshot) -> ShareState:
    return ShareState(m.group_id, m.topic, m.partition, start_offset=m.start_offset,
                      state_epoch=m.state_epoch, leader_epoch=m.leader_epoch,
                      batches=tuple(StateBatch(b.first_offset, b.last_offset, b.delivery_state,
                                               b.delivery_count) for b in m.batches))


class ShareGroupStateServicer(ipb_grpc.ShareGroupStateServicer):
    """On the driver: the leaders' calls on the share state store. A refusal of the store
    (fenced, a bad snapshot) is the answer's error code; a store that does not answer in
    time is a failed call."""

    def __init__(self, store: ShareStateStore) -> None:
        self._store = store

    def ClaimShareGroupState(self, request: ipb.ClaimShareGroupStateRequest,
                             context: Any) -> ipb.ShareGroupStateResponse:
        return self._answer(context, lambda: self._store.claim(
            request.group_id, request.topic, request.partition, request.leader_epoch))

    def WriteShareGroupState(self, request: ipb.WriteShareGroupStateRequest,
                             context: Any) -> ipb.ShareGroupStateResponse:
        return self._answer(context, lambda: self._store.write(from_snapshot(request.state)))

    def InitializeShareGroupState(self, request: ipb.InitializeShareGroupStateRequest,
                                  context: Any) -> ipb.ShareGroupStateResponse:
        return self._answer(context, lambda: self._store.alter(
            request.group_id, request.topic, request.partition, request.start_offset))

    @staticmethod
    def _answer(context: Any, call: Any) -> ipb.ShareGroupStateResponse:
        try:
            state = call().result(STATE_CALL_TIMEOUT_S)
        except errors.DeltaBusError as e:
            return ipb.ShareGroupStateResponse(error_code=e.code, error_message=e.message)
        except TimeoutError:
            abort(context, errors.CoordinatorNotAvailableError(
                "__share_group_state did not answer in time"))
        if state is None:
            return ipb.ShareGroupStateResponse(found=False)
        return ipb.ShareGroupStateResponse(found=True, state=to_snapshot(state))


class ShareStateChannel:
    """A broker's client of the driver's share state store (its inter-broker listener)."""

    def __init__(self, address: str, broker_id: int, *, broker_secret: str,
                 security: ListenerSecurity) -> None:
        self._channel = open_channel(address, f"deltabus-broker-{broker_id}",
                                     credentials=grpc_peer_credentials(security))
        self._stub = ipb_grpc.ShareGroupStateStub(self._channel)
        self._credential = credential_metadata(broker_secret)

    def close(self) -> None:
        self._channel.close()

    def claim(self, group_id: str, topic: str, partition: int,
              leader_epoch: int) -> Future[ShareState | None]:
        return self._call(self._stub.ClaimShareGroupState, ipb.ClaimShareGroupStateRequest(
            group_id=group_id, topic=topic, partition=partition, leader_epoch=leader_epoch))

    def write(self, state: ShareState) -> Future[None]:
        return self._call(self._stub.WriteShareGroupState,
                          ipb.WriteShareGroupStateRequest(state=to_snapshot(state)),
                          answer=lambda _: None)

    def alter(self, group_id: str, topic: str, partition: int,
              start_offset: int) -> Future[ShareState]:
        return self._call(self._stub.InitializeShareGroupState,
                          ipb.InitializeShareGroupStateRequest(
                              group_id=group_id, topic=topic, partition=partition,
                              start_offset=start_offset))

    def _call(self, method: Any, request: Any, answer: Any = None) -> Future[Any]:
        result: Future[Any] = Future()
        call = method.future(request, timeout=STATE_CALL_TIMEOUT_S, metadata=self._credential)

        def done(call: Any) -> None:
            try:
                response = call.result()
            except grpc.RpcError as e:
                result.set_exception(errors.CoordinatorNotAvailableError(
                    f"the share state store: {e.code() if hasattr(e, 'code') else e}"))
                return
            if response.error_code:
                result.set_exception(errors.error_for_code(response.error_code,
                                                           response.error_message))
                return
            state = from_snapshot(response.state) if response.found else None
            result.set_result(state if answer is None else answer(state))

        call.add_done_callback(done)
        return result
