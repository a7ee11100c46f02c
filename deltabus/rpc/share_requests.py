"""The share group calls of the request layer (KIP-932): what both doors' ShareGroupHeartbeat,
ShareGroupDescribe, ShareFetch and ShareAcknowledge are held to before they reach the group
coordinator (membership) or a partition's leader (records), with Kafka's ACLs:
- ShareGroupHeartbeat: READ on the group, DESCRIBE on each subscribed topic;
- ShareGroupDescribe: DESCRIBE on the group, and on each topic its assignments name;
- ShareFetch, ShareAcknowledge: READ on the group (the whole request is refused), READ on each
  topic (its partitions are answered TOPIC_AUTHORIZATION_FAILED and never reach the leader);
- DescribeShareGroupOffsets: DESCRIBE on the group and each topic (a listing of every partition
  leaves out the topics the caller may not DESCRIBE);
- AlterShareGroupOffsets: READ on the group and each topic;
- DeleteShareGroupOffsets: DELETE on the group, READ on each topic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from deltabus import errors
from deltabus.cluster.handler import (
    DeltaBusHandler,
    ShareFetchAnswer,
    ShareFetchRequest,
    SharePartitionData,
)
from deltabus.offsets.group_coordinator import GroupCoordinator, ShareOffset
from deltabus.offsets.share_group import ShareGroup, ShareHeartbeatResult
from deltabus.rpc.access import Access
from deltabus.security.acls import Operation


@dataclass(frozen=True)
class ShareGroupHeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: list[str] | None = None
    client_id: str = ""
    client_host: str = ""


class ShareRequests:
    """Validates, authorizes and carries out the share group calls of both doors."""

    def __init__(self, handler: DeltaBusHandler, groups: GroupCoordinator | None) -> None:
        self._handler = handler
        self._groups = groups

    def _coordinator(self) -> GroupCoordinator:
        if self._groups is None:
            raise errors.NotCoordinatorError(
                "this server is not the group coordinator: ask FindCoordinator")
        return self._groups

    def heartbeat(self, access: Access,
                  request: ShareGroupHeartbeatRequest) -> ShareHeartbeatResult:
        Access.raise_if(access.group(Operation.READ, request.group_id))
        for topic in request.subscribed_topic_names or ():
            Access.raise_if(access.topic(Operation.DESCRIBE, topic))
        return self._coordinator().share_group_heartbeat(
            request.group_id, request.member_id, request.member_epoch, rack_id=request.rack_id,
            subscribed_topic_names=request.subscribed_topic_names,
            client_id=request.client_id, client_host=request.client_host)

    def describe(self, access: Access, group_id: str) -> ShareGroup:
        Access.raise_if(access.group(Operation.DESCRIBE, group_id))
        group = self._coordinator().describe_share_group(group_id)
        for member in group.members.values():
            for topic in member.assigned:
                Access.raise_if(access.topic(Operation.DESCRIBE, topic))
        return group

    def share_fetch(self, access: Access, request: ShareFetchRequest) -> ShareFetchAnswer:
        """ShareFetch (or ShareAcknowledge: `request.fetching` False) on this leader."""
        refused = access.group(Operation.READ, request.group_id)
        if refused is not None:
            return ShareFetchAnswer(refused, [], 0.0, lambda: [])
        named = {*request.added, *request.forgotten, *request.acknowledgements}
        denied = {t: e for t in {t for t, _ in named}
                  if (e := access.topic(Operation.READ, t)) is not None}
        if not denied:
            return self._handler.share_fetch(request)
        allowed = dataclasses.replace(
            request, added=[tp for tp in request.added if tp[0] not in denied],
            forgotten=[tp for tp in request.forgotten if tp[0] not in denied],
            acknowledgements={tp: b for tp, b in request.acknowledgements.items()
                              if tp[0] not in denied})
        answer = self._handler.share_fetch(allowed)
        refusals = [SharePartitionData(t, p, error=denied[t],
                                       acknowledged=(t, p) in request.acknowledgements,
                                       acknowledge_error=denied[t])
                    for t, p in sorted(named) if t in denied]
        complete = answer.complete
        return dataclasses.replace(answer, complete=lambda: complete() + refusals)

    # ---- admin ---------------------------------------------------------------------------

    def describe_offsets(self, access: Access, group_id: str,
                         partitions: list[tuple[str, int]] | None
                         ) -> dict[tuple[str, int], ShareOffset | errors.DeltaBusError]:
        Access.raise_if(access.group(Operation.DESCRIBE, group_id))
        found = self._coordinator().describe_share_group_offsets(group_id, partitions)
        answers: dict[tuple[str, int], ShareOffset | errors.DeltaBusError] = {}
        for tp, offset in found.items():
            refused = access.topic(Operation.DESCRIBE, tp[0])
            if refused is None:
                answers[tp] = offset
            elif partitions is not None:
                answers[tp] = refused
        return answers

    def alter_offsets(self, access: Access, group_id: str, offsets: dict[tuple[str, int], int]
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        Access.raise_if(access.group(Operation.READ, group_id))
        answers: dict[tuple[str, int], errors.DeltaBusError | None] = {
            tp: e for tp in offsets if (e := access.topic(Operation.READ, tp[0])) is not None}
        allowed = {tp: o for tp, o in offsets.items() if tp not in answers}
        if allowed:
            answers.update(self._coordinator().alter_share_group_offsets(group_id, allowed))
        return answers

    def delete_offsets(self, access: Access, group_id: str, topics: list[str]
                       ) -> dict[str, errors.DeltaBusError | None]:
        Access.raise_if(access.group(Operation.DELETE, group_id))
        answers: dict[str, errors.DeltaBusError | None] = {
            t: e for t in topics if (e := access.topic(Operation.READ, t)) is not None}
        allowed = [t for t in topics if t not in answers]
        if allowed:
            answers.update(self._coordinator().delete_share_group_offsets(group_id, allowed))
        return answers
