"""Delaying packets where tc netem is missing: this machine's kernel has no netem qdisc
(CONFIG_NET_SCH_NETEM is not set), but it has netfilter's queue (NFQUEUE). An iptables rule
sends the chosen packets to a queue; this module holds each one for the delay and then lets it
go (its verdict), in the order they came, as netem does without reordering.

It speaks nfnetlink_queue itself over a netlink socket (the protocol of libnetfilter_queue,
whose Python binding needs a compiler and Debian's headers): bind a queue, ask for packet
metadata only, answer each packet's id with NF_ACCEPT. The queue fails open (a full queue
accepts rather than drops), so the only loss is what the caller asks for with its own rule.
Needs root. One queue per `PacketDelay`; thread-safe to start and stop from one thread."""

from __future__ import annotations

import collections
import random
import socket
import struct
import threading
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
QUEUE_LENGTH_MAX = 100_000  # packets held at once; past it the queue fails open
RECEIVE_BUFFER_BYTES = 16 << 20


def _attribute(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, queue: int, attributes: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attributes
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0,
                       0) + body


def _attributes(data: bytes) -> dict[int, bytes]:
    found, at = {}, 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        found[kind & 0x7FFF] = data[at + 4:at + length]
        at += (length + 3) & ~3
    return found


class PacketDelay:
    """Holds every packet of queue `queue` for `delay_ms` (plus up to `jitter_ms`, never
    passing an earlier packet), from `start` until `stop`."""

    def __init__(self, queue: int, delay_ms: int, jitter_ms: int = 0) -> None:
        self.queue, self.delay_s, self.jitter_s = queue, delay_ms / 1000, jitter_ms / 1000
        self.delayed = 0  # packets let through after their delay
        self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self._socket.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER_BYTES)  # SO_RCVBUFFORCE
        self._socket.bind((0, 0))
        self._held: collections.deque[tuple[float, int]] = collections.deque()
        self._changed = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._receive, daemon=True, name="nfq-in"),
                         threading.Thread(target=self._release, daemon=True, name="nfq-out")]

    def start(self) -> PacketDelay:
        cmd = struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_UNSPEC)
        self._send(NFQNL_MSG_CONFIG, _attribute(NFQA_CFG_CMD, cmd))
        self._send(NFQNL_MSG_CONFIG, _attribute(NFQA_CFG_PARAMS,
                                                struct.pack("!IB", 0, NFQNL_COPY_META)))
        self._send(NFQNL_MSG_CONFIG, _attribute(NFQA_CFG_QUEUE_MAXLEN,
                                                struct.pack("!I", QUEUE_LENGTH_MAX)))
        self._send(NFQNL_MSG_CONFIG,
                   _attribute(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))
                   + _attribute(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Let every held packet go now and unbind the queue (call after the rules that feed
        it are gone, or their next packets wait for a listener that left)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._threads[1].join(10)
        self._send(NFQNL_MSG_CONFIG, _attribute(
            NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, socket.AF_UNSPEC)))
        self._socket.close()  # ends the receiver

    def _send(self, kind: int, attributes: bytes) -> None:
        self._socket.send(_message(kind, self.queue, attributes))

    def _receive(self) -> None:
        last_due = 0.0
        while True:
            try:
                data = self._socket.recv(1 << 16)
            except OSError:  # closed by stop
                return
            at = 0
            while at + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, at)
                if length < 16:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    header = _attributes(data[at + 20:at + length]).get(NFQA_PACKET_HDR)
                    if header is not None:
                        packet_id = struct.unpack_from("!I", header)[0]
                        due = time.monotonic() + self.delay_s + random.uniform(0, self.jitter_s)
                        last_due = max(due, last_due)
                        with self._changed:
                            self._held.append((last_due, packet_id))
                            self._changed.notify_all()
                at += (length + 3) & ~3

    def _release(self) -> None:
        while True:
            with self._changed:
                while not self._held and not self._stopping:
                    self._changed.wait()
                if not self._held:
                    return
                due, packet_id = self._held[0]
                wait_s = due - time.monotonic()
                if wait_s > 0 and not self._stopping:
                    self._changed.wait(wait_s)
                    continue
                self._held.popleft()
            self._send(NFQNL_MSG_VERDICT,
                       _attribute(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)))
            self.delayed += 1
