"""A broker's metadata cache (Kafka's KRaftMetadataCache): the last metadata image the broker
applied, which every request it serves reads.

Separate from the part that writes it (`broker_metadata_publisher`) and the parts that read it
(`replica_manager`, `broker`), so that each holds this one small object rather than each other.
Runs on executors. Thread-safe: the image is replaced whole, never changed in place, so a
reader takes one reference and works with one version; `image_applied` is notified with every
image applied, for requests that wait for metadata to arrive (a producer's transaction, a
schema registered a moment ago).
"""

from __future__ import annotations

import threading

from deltabus.metadata import MetadataImage, empty_image


class MetadataCache:
    """The image a broker serves from; written only by its metadata publisher."""

    def __init__(self) -> None:
        self.image: MetadataImage = empty_image()
        self.image_applied = threading.Condition()  # notified with every image applied

    def publish(self, image: MetadataImage) -> None:
        """Serve `image` from now on, and wake the requests waiting for metadata."""
        with self.image_applied:
            self.image = image
            self.image_applied.notify_all()
