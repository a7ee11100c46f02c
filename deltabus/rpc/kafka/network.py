"""The Kafka door's network layer: one thread per listener accepts and serves all its connections
with `selectors` (Kafka's SocketServer, its Acceptor and Processor in one thread), and hands the
requests it reads to the request handlers (`listener`). No thread is made per connection: an idle
connection is a socket and a small `_Connection`.

What must stay true:
- only the network thread touches sockets, the selector and connection state; other threads
  talk to it through `_post` (a queue and a wake-up socket), and a `Request`'s `release`,
  `respond` and `fail` are the only calls they make;
- a connection's requests are handed over in the order they were read, as a run: all those
  read and not yet handled, together, to be handled one after the other on one handler thread.
  The next run goes once the handlers `release` the whole run before (they release a request
  that waits by design, such as a long-polling Fetch, at once, so the next is handled while it
  waits), or `give_back` what they did not handle (a throttled or closing connection). A client
  sending a request per record (librdkafka at linger.ms=0) thus costs one hand-over between the
  threads per run, not per request: at a request each 2 ms, one per request fell behind without
  end on 2 busy cores (acks 200 ms late and growing). Before SASL authentication a connection's
  next request is not even read until the previous is answered;
- responses go out strictly in request order, each connection's own, whatever order the
  handlers finish in (Kafka's clients match them by order and correlation id);
- limits (cfg.SocketServerConfig, Kafka's names): a frame over socket.request.max.bytes closes
  its connection; at most max.in.flight.requests.per.connection requests of a connection are
  read and not yet answered; past queued.max.requests requests handed over and not released,
  or queued.max.request.bytes read and not released, nothing more is read from anyone until
  handlers catch up; a connection past max.connections or max.connections.per.ip is closed as
  soon as it is accepted; one idle for connections.max.idle.ms (owing no answer) is closed; a
  TLS handshake not done within TLS_HANDSHAKE_TIMEOUT_S is closed;
- a connection whose answer carries a throttle time (a client quota) is muted for that long
  once the answer is placed (KIP-219): nothing more is read or handed over from it until the
  time is over, so a client that ignores the throttle is held all the same;
- one connection's trouble closes that connection only, with a log line saying why.
"""

from __future__ import annotations

import collections
import errno
import logging
import queue
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from deltabus import config as cfg
from deltabus.rpc.kafka.connection_quotas import ConnectionQuotas
from deltabus.rpc.kafka.sasl import KafkaSession
from deltabus.rpc.tls import certificate_principal
from deltabus.security.principal import ANONYMOUS

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
TLS_HANDSHAKE_TIMEOUT_S = 10.0
RECV_BYTES = 64 * 1024  # one read of a connection; a large frame's body is read in larger ones
RECV_BYTES_MAX = 1024 * 1024
SEND_BYTES_MAX = 1024 * 1024  # one write of a connection
ACCEPTS_PER_EVENT = 64  # connections accepted per wake-up, so a flood does not starve reads
ACCEPT_BACKOFF_S = 0.1  # out of file descriptors: wait this long before accepting again
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_LISTEN, _WAKE = object(), object()
_TLS_RETRY = (ssl.SSLWantReadError, ssl.SSLWantWriteError)

# A request's states, in order: read, handed to the handlers, released by them (its answer
# owed), answered.
QUEUED, HANDLING, WAITING, DONE = range(4)


class _Slot:
    """One request of a connection, from the moment it was read until its answer is sent."""

    __slots__ = ("frame", "reserved_bytes", "received_s", "state", "response", "last")

    def __init__(self, frame: bytes, received_s: float) -> None:
        self.frame: bytes | None = frame
        self.reserved_bytes = len(frame)  # of queued.max.request.bytes, until released
        self.received_s = received_s
        self.state = QUEUED
        self.response: bytes | None = None
        self.last = False  # the connection closes once this answer is sent


class _Connection:
    """One client connection; the network thread's alone."""

    __slots__ = ("sock", "peer", "host", "session", "handshaking", "inbuf", "reserved_bytes",
                 "slots", "sending", "mask", "closed", "closing", "blocked", "muted_until",
                 "peer_closed")

    def __init__(self, sock: socket.socket, host: str, port: int, sasl_required: bool) -> None:
        self.sock = sock
        self.peer = f"{host}:{port}"
        self.host = host
        self.session = KafkaSession(host, sasl_required=sasl_required)
        self.handshaking = False
        self.inbuf = bytearray()
        self.reserved_bytes = 0  # of queued.max.request.bytes, for the frame being read
        self.slots: collections.deque[_Slot] = collections.deque()
        self.sending: memoryview | None = None  # what is left to send of slots[0]'s answer
        self.mask = 0  # the events the selector watches for
        self.closed = False
        self.closing = False  # its last answer is due: nothing more is read or handled
        self.blocked = False  # waiting for room in the handlers' queue or the request bytes
        self.muted_until = 0.0  # time.monotonic() until which it is throttled (KIP-219)
        # The client closed it: the requests read are still handled, their answers dropped,
        # then it closes (Kafka's Selector processes a closed channel's staged receives).
        self.peer_closed = False

    def pre_authentication(self) -> bool:
        return self.session.sasl_required and not self.session.authenticated


class Request:
    """A request the network thread hands to the handlers. Any thread may call `release`,
    `respond` and `fail`, once each at most (a later call for the same request is ignored)."""

    __slots__ = ("_processor", "_connection", "_slot", "frame", "received_s", "session",
                 "peer")

    def __init__(self, processor: Processor, connection: _Connection, slot: _Slot) -> None:
        self._processor, self._connection, self._slot = processor, connection, slot
        assert slot.frame is not None
        self.frame: bytes = slot.frame
        self.received_s = slot.received_s  # time.monotonic() when it was read
        self.session = connection.session
        self.peer = connection.peer

    def release(self) -> None:
        """The handlers are done with the frame: the connection's next request may be handled
        while this one's answer is still owed."""
        self._processor._post(("release", self._connection, self._slot))

    def give_back(self) -> None:
        """The handlers did not handle this request of their run (its connection got muted or
        is closing): it waits to be handed over again, in its place."""
        self._processor._post(("give_back", self._connection, self._slot))

    def respond(self, response: bytes | None, *, last: bool = False,
                throttle_ms: int = 0) -> None:
        """The answer (None: none is due, as for acks=0); `last`: close after sending it;
        `throttle_ms`: mute the connection that long (its client is over a quota)."""
        self._processor._post(("respond", self._connection, self._slot, response, last,
                               throttle_ms))

    def fail(self, reason: str) -> None:
        """The request cannot be answered: its connection closes, with `reason` in the log."""
        self._processor._post(("fail", self._connection, self._slot, reason))


class Processor:
    """Accepts and serves every connection of one listening socket, on a thread of its own.
    `handle(run)` runs on that thread for each run of a connection's requests it hands over
    (in their order), and must return at once (it queues the run for a handler thread)."""

    def __init__(self, server: socket.socket, handle: Callable[[list[Request]], None], *,
                 config: cfg.SocketServerConfig, ssl_context: ssl.SSLContext | None,
                 sasl_required: bool) -> None:
        self._server = server
        self._handle = handle
        self._config = config
        self._ssl_context = ssl_context
        self._sasl_required = sasl_required
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (server, self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._selector.register(server, _READ, _LISTEN)
        self._selector.register(self._wake_r, _READ, _WAKE)
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._connections: set[_Connection] = set()
        self._quotas = ConnectionQuotas(config)
        # Connections owing no answer, least recently active first (connections.max.idle.ms).
        self._idle: collections.OrderedDict[_Connection, float] = collections.OrderedDict()
        self._handshakes: collections.OrderedDict[_Connection, float] = collections.OrderedDict()
        self._muted: dict[_Connection, float] = {}  # throttled connections, until when
        self._blocked: set[_Connection] = set()
        self._ready: set[_Connection] = set()  # TLS bytes decrypted and not yet read
        self._handling = 0  # requests handed over and not released (queued.max.requests)
        self._queued_bytes = 0  # request bytes read and not released (queued.max.request.bytes)
        self._accept_paused_until = 0.0
        self._stopping = threading.Event()

    # ---- the thread -----------------------------------------------------------------------------

    def run(self) -> None:
        """The network thread's loop, until `stop`."""
        try:
            while not self._stopping.is_set():
                events = self._selector.select(self._timeout_s())
                for key, mask in events:
                    if key.data is _LISTEN:
                        self._accept()
                    elif key.data is _WAKE:
                        self._drain_wake()
                    else:
                        self._guarded(key.data, self._on_event, key.data, mask)
                for connection in list(self._ready):
                    self._ready.discard(connection)
                    self._guarded(connection, self._on_event, connection, _READ)
                self._drain_inbox()
                self._resume_blocked()
                self._expire(time.monotonic())
        except Exception:  # a bug: the listener is gone, and the log says why
            log.exception("the Kafka listener's network thread failed")
            raise
        finally:
            self._close_everything()

    def stop(self) -> None:
        """Ask the thread to close every connection and the listening socket and end."""
        self._stopping.set()
        self._wake()

    def close(self) -> None:
        """Close the listening socket of a processor whose thread never ran."""
        self._close_everything()

    def _timeout_s(self) -> float:
        if self._ready:
            return 0.0
        now = time.monotonic()
        deadlines = [now + 1.0]
        if self._idle:
            deadlines.append(next(iter(self._idle.values()))
                             + self._config.connections_max_idle_ms / 1000)
        if self._handshakes:
            deadlines.append(next(iter(self._handshakes.values())))
        if self._accept_paused_until:
            deadlines.append(self._accept_paused_until)
        if self._muted:
            deadlines.append(min(self._muted.values()))
        return max(0.0, min(deadlines) - now)

    def _guarded(self, connection: _Connection, serve: Callable[..., None],
                 *args: Any) -> None:
        """Serve one connection; a bug doing so closes that connection, not the listener."""
        try:
            serve(*args)
        except Exception:
            log.exception("closing Kafka connection from %s: serving it failed",
                          connection.peer)
            self._close(connection)

    def _post(self, event: tuple[Any, ...]) -> None:
        self._inbox.put(event)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the socket is full (a wake-up is due anyway) or closed (stopping)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # ---- accepting ------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_EVENT):
            try:
                sock, address = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("Kafka listener out of resources accepting a connection (%s): "
                                "accepting again in %.1f s", e.strerror, ACCEPT_BACKOFF_S)
                    self._selector.unregister(self._server)
                    self._accept_paused_until = time.monotonic() + ACCEPT_BACKOFF_S
                    return
                continue  # the client gave up before we accepted (ECONNABORTED, ...)
            host, port = address[0], address[1]
            refusal = self._quotas.refusal(host, len(self._connections))
            if refusal is not None:
                log.info("closing Kafka connection from %s:%d at once: %s", host, port,
                         refusal)
                sock.close()
                continue
            try:
                self._open(sock, host, port)
            except OSError as e:  # reset before it was served (TLS set-up reads the socket)
                log.info("closing Kafka connection from %s:%d: %s", host, port, e)
                sock.close()

    def _open(self, sock: socket.socket, host: str, port: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl_context is not None:
            sock = self._ssl_context.wrap_socket(sock, server_side=True,
                                                 do_handshake_on_connect=False)
        connection = _Connection(sock, host, port, self._sasl_required)
        self._connections.add(connection)
        self._quotas.opened(host)
        if self._ssl_context is not None:
            connection.handshaking = True
            self._handshakes[connection] = time.monotonic() + TLS_HANDSHAKE_TIMEOUT_S
            self._handshake(connection)
        else:
            self._pump(connection)

    def _handshake(self, connection: _Connection) -> None:
        """One step of the TLS handshake; once it is done the connection serves requests."""
        sock = connection.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(connection, _READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(connection, _WRITE)
            return
        except (ssl.SSLError, OSError) as e:
            log.info("closing Kafka connection from %s: TLS handshake failed: %s",
                     connection.peer, e)
            self._close(connection)
            return
        connection.handshaking = False
        del self._handshakes[connection]
        if not connection.session.sasl_required:
            connection.session.principal = (certificate_principal(sock.getpeercert())
                                            or ANONYMOUS)
        self._pump(connection)

    # ---- one connection -------------------------------------------------------------------------

    def _on_event(self, connection: _Connection, mask: int) -> None:
        if connection.closed:
            return
        if connection.handshaking:
            self._handshake(connection)
            return
        if mask & _WRITE:
            self._send(connection)
        if mask & _READ and not connection.closed:
            if self._may_read(connection):
                self._receive(connection)
            elif not connection.closing:
                self._block(connection)
        if not connection.closed:
            self._pump(connection)

    def _receive(self, connection: _Connection) -> None:
        """Read what the connection has (TLS: and what TLS decrypted beyond it)."""
        sock = connection.sock
        size = RECV_BYTES
        if len(connection.inbuf) >= 4:
            wanted = 4 + _SIZE.unpack_from(connection.inbuf)[0] - len(connection.inbuf)
            size = min(max(wanted, RECV_BYTES), RECV_BYTES_MAX)
        try:
            data = sock.recv(size)
        except (BlockingIOError, InterruptedError, *_TLS_RETRY):
            return
        except OSError:
            self._close(connection)
            return
        if not data:
            connection.peer_closed = True  # what was read is still handled (`_pump`)
            return
        connection.inbuf += data
        if connection in self._idle:
            self._idle[connection] = time.monotonic()
            self._idle.move_to_end(connection)

    def _pump(self, connection: _Connection) -> None:
        """Take the frames read, hand the next request over, send what is answered, and
        watch the socket for what the connection now waits for."""
        while True:
            self._take_frames(connection)
            self._dispatch(connection)
            in_flight = len(connection.slots)
            self._send(connection)
            if connection.closed:
                return
            if len(connection.slots) == in_flight:
                break  # nothing was answered: no room for frames already read
        if connection.peer_closed and not any(s.state in (QUEUED, HANDLING)
                                              for s in connection.slots):
            if len(connection.inbuf) < 4 or \
                    len(connection.inbuf) < 4 + _SIZE.unpack_from(connection.inbuf)[0]:
                if connection.inbuf:
                    log.info("closing Kafka connection from %s: it ended inside a request",
                             connection.peer)
                self._close(connection)  # every request read was handled
                return
        reading = self._wants_read(connection)
        if reading and self._full():
            self._block(connection)  # read again by _resume_blocked, once there is room
            reading = False
        mask = (_READ if reading else 0) | (_WRITE if connection.sending is not None else 0)
        self._watch(connection, mask)
        if (mask & _READ and isinstance(connection.sock, ssl.SSLSocket)
                and connection.sock.pending()):
            self._ready.add(connection)
        if connection.slots:
            self._idle.pop(connection, None)  # owes an answer: not idle however long it takes
        elif connection not in self._idle:
            self._idle[connection] = time.monotonic()

    def _in_flight_max(self, connection: _Connection) -> int:
        if connection.pre_authentication():
            return 1  # SASL: strictly one request at a time until authenticated
        return self._config.max_in_flight_requests_per_connection

    def _may_read(self, connection: _Connection) -> bool:
        return self._wants_read(connection) and not self._full()

    def _wants_read(self, connection: _Connection) -> bool:
        """Whether the connection is read once the handlers' queues have room (a connection
        that wants to but finds them full must wait among the blocked, or nothing wakes it)."""
        return (not connection.closing and not connection.handshaking and not connection.blocked
                and not connection.peer_closed and connection not in self._muted
                and len(connection.slots) < self._in_flight_max(connection))

    def _full(self) -> bool:
        return (self._handling >= self._config.queued_max_requests
                or self._queued_bytes >= self._config.queued_max_request_bytes)

    def _take_frames(self, connection: _Connection) -> None:
        """Move the complete frames read into the connection's requests, as far as its
        in-flight limit and queued.max.request.bytes allow."""
        inbuf = connection.inbuf
        while (not connection.closing and len(inbuf) >= 4
               and len(connection.slots) < self._in_flight_max(connection)):
            (size,) = _SIZE.unpack_from(inbuf)
            limit = self._config.socket_request_max_bytes
            if not 0 < size <= limit:
                log.warning("closing Kafka connection from %s: a request of %d bytes (the most "
                            "is socket.request.max.bytes=%d)", connection.peer, size, limit)
                self._close(connection)
                return
            if not connection.reserved_bytes:
                if self._queued_bytes and self._queued_bytes + size > \
                        self._config.queued_max_request_bytes:
                    self._block(connection)
                    return
                connection.reserved_bytes = size
                self._queued_bytes += size
            if len(inbuf) < 4 + size:
                return
            slot = _Slot(bytes(inbuf[4:4 + size]), time.monotonic())
            del inbuf[:4 + size]
            connection.reserved_bytes = 0  # the slot holds the reservation now
            connection.slots.append(slot)

    def _dispatch(self, connection: _Connection) -> None:
        """Hand the connection's requests not yet handled to the handlers as one run, if none
        of its is with them (up to the room queued.max.requests leaves)."""
        if connection.closing or connection.closed or connection in self._muted:
            return
        run: list[_Slot] = []
        room = self._config.queued_max_requests - self._handling
        for slot in connection.slots:
            if slot.state == HANDLING:
                return
            if slot.state == QUEUED and len(run) < room:
                run.append(slot)
        if not run:
            if any(s.state == QUEUED for s in connection.slots):
                self._block(connection)
            return
        for slot in run:
            slot.state = HANDLING
        self._handling += len(run)
        self._handle([Request(self, connection, slot) for slot in run])

    def _send(self, connection: _Connection) -> None:
        """Send the answers ready at the head of the connection's requests, in their order."""
        slots = connection.slots
        while slots and (connection.sending is not None or slots[0].state == DONE):
            if connection.sending is None:
                head = slots[0]
                if head.response is None or connection.peer_closed:  # acks=0, or no one to
                    self._answered(connection)                       # send it to
                    continue
                connection.sending = memoryview(head.response)
            try:
                sent = connection.sock.send(connection.sending[:SEND_BYTES_MAX])
            except (BlockingIOError, InterruptedError, *_TLS_RETRY):
                return
            except OSError:
                self._close(connection)
                return
            connection.sending = connection.sending[sent:]
            if not connection.sending:
                connection.sending = None
                self._answered(connection)
        if connection.closing and not slots and not connection.closed:
            self._close(connection)

    def _answered(self, connection: _Connection) -> None:
        slot = connection.slots.popleft()
        if slot.last:
            log.info("closing Kafka connection from %s (%s): SASL authentication failed",
                     connection.peer, connection.session.principal)
            connection.slots.clear()
            self._close(connection)

    def _watch(self, connection: _Connection, mask: int) -> None:
        if mask == connection.mask or connection.closed:
            return
        if not connection.mask:
            self._selector.register(connection.sock, mask, connection)
        elif not mask:
            self._selector.unregister(connection.sock)
        else:
            self._selector.modify(connection.sock, mask, connection)
        connection.mask = mask

    def _block(self, connection: _Connection) -> None:
        """The connection waits for room in the handlers' queue or the request bytes."""
        connection.blocked = True
        self._blocked.add(connection)
        self._watch(connection, connection.mask & ~_READ)

    def _resume_blocked(self) -> None:
        if not self._blocked or self._full():
            return
        for connection in list(self._blocked):
            if self._full():
                return
            self._blocked.discard(connection)
            connection.blocked = False
            if not connection.closed:
                self._pump(connection)

    # ---- the handlers' answers ------------------------------------------------------------------

    def _drain_inbox(self) -> None:
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._guarded(event[1], self._on_answer, *event)

    def _on_answer(self, kind: str, connection: _Connection, slot: _Slot, *rest: Any) -> None:
        """A handler's `release`, `give_back`, `respond` or `fail` of one request."""
        if kind == "give_back":
            if slot.state == HANDLING and not connection.closed:
                slot.state = QUEUED
                self._handling -= 1
                self._pump(connection)
            return
        self._release(slot)
        if connection.closed or slot.state == DONE:
            return
        if kind == "respond":
            slot.state, slot.response = DONE, rest[0]
            if rest[1]:
                slot.last = connection.closing = True
            if rest[2] > 0:
                self._mute(connection, time.monotonic() + rest[2] / 1000)
        elif kind == "fail":
            log.warning("closing Kafka connection from %s: %s", connection.peer, rest[0])
            self._close(connection)
            return
        self._pump(connection)

    def _mute(self, connection: _Connection, until: float) -> None:
        """Read and hand over nothing of the connection until `until` (its answers still go)."""
        connection.muted_until = max(connection.muted_until, until)
        self._muted[connection] = connection.muted_until

    def _release(self, slot: _Slot) -> None:
        """The handlers are done with the slot's frame: its room in the queues is free."""
        if slot.state == HANDLING:
            slot.state = WAITING
            self._handling -= 1
        self._queued_bytes -= slot.reserved_bytes
        slot.reserved_bytes = 0
        slot.frame = None

    # ---- time limits and closing ----------------------------------------------------------------

    def _expire(self, now: float) -> None:
        idle_ms = self._config.connections_max_idle_ms
        while self._idle:
            connection, last = next(iter(self._idle.items()))
            if now - last < idle_ms / 1000:
                break
            log.info("closing Kafka connection from %s: idle for %d ms "
                     "(connections.max.idle.ms=%d)", connection.peer, (now - last) * 1000,
                     idle_ms)
            self._close(connection)
        while self._handshakes:
            connection, deadline = next(iter(self._handshakes.items()))
            if now < deadline:
                break
            log.info("closing Kafka connection from %s: no TLS handshake within %g s",
                     connection.peer, TLS_HANDSHAKE_TIMEOUT_S)
            self._close(connection)
        for connection, until in list(self._muted.items()):
            if now >= until:
                del self._muted[connection]
                if not connection.closed:
                    self._pump(connection)
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self._server, _READ, _LISTEN)

    def _close(self, connection: _Connection) -> None:
        """Close the connection and free everything it held; handler threads still working on
        its requests find it closed and their answers are dropped."""
        if connection.closed:
            return
        connection.closed = True
        if connection.mask:
            self._selector.unregister(connection.sock)
        try:
            connection.sock.close()
        except OSError:
            pass
        for slot in connection.slots:
            self._release(slot)
        connection.slots.clear()
        self._queued_bytes -= connection.reserved_bytes
        connection.reserved_bytes = 0
        connection.inbuf = bytearray()
        connection.sending = None
        for members in (self._idle, self._handshakes, self._muted):
            members.pop(connection, None)
        self._blocked.discard(connection)
        self._ready.discard(connection)
        self._connections.discard(connection)
        self._quotas.closed(connection.host)

    def _close_everything(self) -> None:
        for connection in list(self._connections):
            self._close(connection)
        self._selector.close()
        for sock in (self._server, self._wake_r, self._wake_w):
            sock.close()
