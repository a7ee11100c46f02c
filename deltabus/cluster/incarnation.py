"""A broker's last incarnation ends before its next one starts: Kafka's lock on log.dirs, which
keeps a second broker process off the same logs.

Why it is needed: when the controller fences a broker, its supervisor's Spark job ends at once,
but the Python worker that ran the broker lives on until Spark kills it, no sooner than
`spark.python.task.killTimeout` (2 s) after the cancel; and a broker cut off from the
controller (a network partition) does not hear meanwhile that it was fenced. Relaunched within
those seconds, the next incarnation bound other ports beside the old one and opened the same
replica tables, and the catch-up job before it wrote them, while the old one still led its
partitions and its followers still fetched from it: two writers of one table, and acknowledged
records truncated when the new one led (the network partition test found it).

So the supervisor (Cluster._supervise) waits, before the catch-up job and the relaunch, until
the broker's last registered inter-broker address refuses connections (the fenced
registration's, when the controller fenced it: the fence deletes it, and a wait that read the
registry then found nothing to wait for), for at most `timeout_s`; past it the next one
starts anyway (Spark never killed the old one, or its machine cannot be reached), and the
put-if-absent commits still fence the old one's writes.

Runs on the driver, in a broker's supervisor thread.
"""

from __future__ import annotations

import logging
import socket
import time

from deltabus.metadata import BrokerEndpoint

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0
POLL_S = 0.1
END_TIMEOUT_S = 30.0


def await_last_incarnation(endpoint: BrokerEndpoint | None,
                           timeout_s: float = END_TIMEOUT_S) -> bool:
    """Wait until broker `endpoint`'s last incarnation no longer serves its registered
    address. True once it does not (or there was none), False after `timeout_s`."""
    if endpoint is None:
        return True
    deadline = time.monotonic() + timeout_s
    while _serving(endpoint):
        if time.monotonic() > deadline:
            log.warning("broker %d's last incarnation still serves %s:%d after %.0f s; "
                        "starting the next one beside it", endpoint.broker_id, endpoint.host,
                        endpoint.port, timeout_s)
            return False
        time.sleep(POLL_S)
    return True


def _serving(endpoint: BrokerEndpoint) -> bool:
    """The last incarnation may still run: something accepts connections at the broker's
    inter-broker address, or nothing answers there. No answer is a network partition that
    drops the probe (or a host that froze), behind which the old process may still lead and
    write its tables: taken for an end, it let the next incarnation open them beside it, and
    acknowledged records were truncated (the network partition test found it). Only a refused
    connection says nothing serves there any more."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), PROBE_TIMEOUT_S):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:  # no answer (timed out, unreachable): it may still run
        return True
