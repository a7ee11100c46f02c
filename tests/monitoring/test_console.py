"""The console in a real browser (headless Chromium): it lists the shared cluster's brokers, a
topic's partitions with their leader, ISR and high watermark, and a group's lag, as the page's
script draws them from the driver's overview. Its ACLs are tested on the secured cluster
(tests/cluster/test_secure_cluster.py)."""

from __future__ import annotations

import json
import urllib.request

from selenium.webdriver.common.by import By

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.conftest import wait_until
from tests.monitoring.browser import chromium, screenshot

PARTITIONS = 3
RECORDS = 90


def test_the_console_shows_brokers_partitions_isr_and_a_groups_lag(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 3)])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for i in range(RECORDS):
            producer.send(topic_name, f"{i}".encode(), partition=i % PARTITIONS)
        producer.flush(60)
    group = f"{topic_name}-readers"
    consumer = Consumer(cluster.bootstrap_servers, group_id=group)
    consumer.commit({TopicPartition(topic_name, 0): 10})
    consumer.close()

    def overview() -> dict:
        with urllib.request.urlopen(cluster.console_url + "/api/overview", timeout=30) as answer:
            return json.loads(answer.read())

    def reported() -> bool:  # the leaders report their logs every offsets.report.interval.ms
        topic = next((t for t in overview()["topics"] if t["name"] == topic_name), None)
        return topic is not None and sum(p["high_watermark"] or 0
                                         for p in topic["partitions"]) == RECORDS
    wait_until(reported, f"the leaders of {topic_name} to report {RECORDS} records")

    with chromium() as browser:
        browser.get(cluster.console_url)
        wait_until(lambda: browser.find_elements(By.ID, f"group-{group}"),
                   "the page to draw the group")
        rows = browser.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")
        assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["0", "1", "2"]
        title = browser.find_element(By.ID, f"topic-{topic_name}")
        partitions = title.find_element(By.XPATH, "following-sibling::table[1]")
        cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")]
                 for row in partitions.find_elements(By.CSS_SELECTOR, "tbody tr")]
        assert [c[0] for c in cells] == ["0", "1", "2"]
        for c in cells:  # leader, replicas, ISR, high watermark
            assert c[1] in ("0", "1", "2") and len(c[2].split(",")) == 3
            assert set(c[3].split(",")) <= set(c[2].split(",")) and c[3]
            assert c[4] == str(RECORDS // PARTITIONS)
        heading = browser.find_element(By.ID, f"group-{group}").text
        assert f"lag {RECORDS // PARTITIONS - 10}" in heading, heading
        screenshot(browser, "console")
