# deltabus: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Kafka clients the tests drive unmodified besides the Python ones: KafkaJS (npm, pinned by the
# lock file) and kcat (Debian's package, on librdkafka).
NODE_TESTS := tests/kafka/node
NODE_STAMP := $(NODE_TESTS)/node_modules/.installed
PROTO := deltabus/rpc/v1/deltabus.proto deltabus/rpc/v1/internal.proto
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON = $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON = $(abspath $(PY))

.PHONY: setup kcat faults monitoring run test bench docs soak protos lint clean

setup: $(STAMP) $(NODE_STAMP) kcat faults monitoring

# pip's PySpark ships its workers' code as sources in a zip, compiled again at each start of a
# Python worker (a streaming query's source runner among them): set-up adds the bytecode
# (deltabus/spark/pyspark_zip.py).
$(STAMP): setup.cfg pyproject.toml
	@command -v java >/dev/null 2>&1 || [ -n "$$JAVA_HOME" ] || { \
	  echo "deltabus needs Java 17 for Spark: install it (Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME" >&2; exit 1; }
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,dev]'
	$(PY) -m deltabus.spark.pyspark_zip
	@touch $(STAMP)

# Where KafkaJS or kcat cannot be installed, set-up says what to install and goes on; their tests
# then fail, saying the same. Each is tried again at the next set-up until it is there.
$(NODE_STAMP): $(NODE_TESTS)/package.json $(NODE_TESTS)/package-lock.json
	@if command -v npm >/dev/null 2>&1 && \
	  npm ci --prefix $(NODE_TESTS) --no-audit --no-fund --loglevel=error; then touch $@; else \
	  echo "KafkaJS tests need Node.js with npm (Debian/Ubuntu: apt-get install -y nodejs npm), then: npm ci --prefix $(NODE_TESTS)" >&2; fi

kcat:
	@command -v kcat >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq kcat; } >/dev/null 2>&1 || \
	  echo "kcat tests need kcat: install it (Debian/Ubuntu: apt-get install -y kcat)" >&2

# The fault tests (tests/faults/) cut and slow loopback traffic with iptables and tc (iproute2),
# mount small filesystems and move broker processes into cgroups: they run as root.
faults:
	@command -v iptables >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq iptables; } >/dev/null 2>&1 || \
	  echo "fault tests need iptables: install it (Debian/Ubuntu: apt-get install -y iptables)" >&2
	@command -v tc >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq iproute2; } >/dev/null 2>&1 || \
	  echo "fault tests need tc: install it (Debian/Ubuntu: apt-get install -y iproute2)" >&2

# The monitoring tests run a real Prometheus (promtool checks the alert rules) and open the
# console in a real browser: Debian's prometheus, chromium and chromium-driver.
monitoring:
	@command -v prometheus >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq prometheus; } >/dev/null 2>&1 || \
	  echo "monitoring tests need Prometheus: install it (Debian/Ubuntu: apt-get install -y prometheus)" >&2
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || \
	  { apt-get update -qq && apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 || \
	  echo "console tests need Chromium: install it (Debian/Ubuntu: apt-get install -y chromium chromium-driver)" >&2

run: setup
	$(VENV)/bin/deltabus cluster start $(ARGS)

# The tests run on PYTEST_WORKERS pytest-xdist workers (2: most of a test's time is waiting, so
# two cores carry two), each module on one of them; tests/conftest.py keeps the modules that start
# JVMs or kill brokers in groups and hands out the longest work first. PYTEST_WORKERS=0 runs them
# in this one process.
PYTEST_WORKERS ?= 2
test: setup lint
	$(PY) -m pytest -q --durations=25 -n $(PYTEST_WORKERS) --dist loadfile $(ARGS)

# The benchmarks (bench/, a development tool beside tests/, not installed): the figures, as JSON,
# then docs/performance.md written from them (the run's table, not a history: that is git's).
# Smaller and quicker, e.g. ARGS="--records 10000 --drain-records 10000 --small-commits 20";
# `$(PY) -m bench --help` lists every size.
BENCH_JSON ?= bench/results.json
bench: setup
	$(PY) -m bench --json $(BENCH_JSON) $(ARGS)
	$(PY) -m bench.performance_page $(BENCH_JSON) docs/performance.md

# The documentation as a site (mkdocs.yml: docs/ into build/docs). `make test` builds it too, with
# the same strict checks (tests/docs/test_site.py): a broken link or anchor, or a page missing
# from the navigation, fails the suite.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The long proofs: fault injection for longer than `make test` runs it (issues 14 and 40),
# DELTABUS_SOAK_S seconds of every nemesis mixed per run (600 by default), and a cluster scaled
# 3 -> 6 -> 3 brokers on separate executor JVMs (issue 41). The soak files' names are outside
# pytest's test_*.py pattern, so only this target, naming them, collects them.
# ARGS="-k mixed_on_s3" runs the S3 soak alone, ARGS="-k diskless" the diskless topics' leader
# kills (issue 44) on S3 and Azurite, ARGS="-k scaling" the scaling runs.
# The soaks run the log cleaner as a cluster does (the suite keeps it from merging the tests'
# files): its merges, vacuum and Delta log cleanup every minute, under the faults.
DELTABUS_SOAK_S ?= 600
SOAK := tests/soak/soak_fault_injection.py tests/soak/soak_scaling.py
soak: setup
	DELTABUS_SOAK_S=$(DELTABUS_SOAK_S) DELTABUS_LOG_CLEANER_MERGE_MIN_AGE_MS=60000 \
	DELTABUS_LOG_RETENTION_CHECK_INTERVAL_MS=60000 $(PY) -m pytest -q -s $(SOAK) $(ARGS)

# Regenerate the gRPC code from the .proto files (tests check it is in sync).
protos: setup
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. $(PROTO)

# House style: ruff and mypy clean (part of `make test`).
lint: setup
	$(VENV)/bin/ruff check deltabus tests bench
	$(VENV)/bin/mypy deltabus bench

clean:
	rm -rf data .pytest_cache build *.egg-info
