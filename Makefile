# The two entry points named in the README: `make demo` and `make test`.
# Both work as root on a fresh Debian 12 machine; everything they need is installed here.

VENV      ?= .venv
PY        := $(VENV)/bin/python
SLURMHET  := $(VENV)/bin/slurmhet
DEVCLUSTER := etc/devcluster/devcluster
PGCLUSTER  := etc/devcluster/pgcluster
# The Slurm that `make demo` runs on: 22.05 on the host, or 24.11 / 26.05 in their chroots.
SLURM     ?= 22.05
# The Slurm series whose real clusters `make test` runs the cluster tests on, side by side: the host's and the newer.
TEST_SLURM_SERIES ?= 22.05 24.11 26.05
export SLURMHET_STATE_DIR ?= $(CURDIR)/$(if $(filter 22.05,$(SLURM)),.state,.state-$(SLURM))
# The dev cluster's GPU types (v100, t4, k80): Gavel's table plus flagged t4 priors.
export SLURMHET_THROUGHPUT_TABLE ?= $(CURDIR)/etc/throughput/devcluster.yaml

.PHONY: demo test test-slurm setup cluster-up cluster-down pg-up pg-down spank goldens clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	etc/bootstrap-python
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[torch,postgres,test]'
	# Bytecode for the editable sources too: with PYTHONDONTWRITEBYTECODE set (as on the dev machines) every
	# command, replan and in-job wrapper would otherwise compile slurmhet afresh (~0.1 s each).
	$(PY) -m compileall -q slurmhet
	touch $@

cluster-up:
	$(DEVCLUSTER) up

cluster-down:
	$(DEVCLUSTER) down

pg-up:
	$(PGCLUSTER) up

pg-down:
	$(PGCLUSTER) down

spank:
	$(MAKE) -C spank

## demo: a real local Slurm cluster with other users' jobs arriving (devcluster noise), the example workload, and a report.
demo: setup
	$(DEVCLUSTER) up --slurm $(SLURM)
	$(DEVCLUSTER) exec --slurm $(SLURM) -- etc/demo

## test: the whole suite, with the real Slurm cluster and PostgreSQL (cluster tests must not skip).
# First everything but tests/cluster: the unit tests, and the chaos run on the host's cluster, alone (it restarts
# PostgreSQL, which every series' tests share). Then each series' cluster tests, all side by side: they mostly wait
# on Slurm, so three at once take about as long as one (CI's 90 minutes).
test: setup cluster-up pg-up
	SLURMHET_REQUIRE_CLUSTER=1 SLURMHET_EXPECT_SLURM=22.05 SLURMHET_TEST_PG_URL="$$($(PGCLUSTER) url)" \
	    $(VENV)/bin/pytest -q --ignore=tests/cluster
	$(MAKE) --no-print-directory -j --output-sync=recurse $(TEST_SLURM_SERIES:%=cluster-tests-%)

## test-slurm: the real-cluster tests on Slurm $(SLURM), its cluster started in its chroot (built once, cached) and stopped after.
test-slurm: setup pg-up
	$(MAKE) --no-print-directory cluster-tests-$(SLURM)

# One series' real-cluster tests, PostgreSQL already up (`pgcluster up` starts it afresh: never while
# another series' tests use it). `make test` runs the series side by side: each has its own cluster (the host's,
# or a chroot's), ports, job ids and store, and --output-sync prints each series' output whole, when it ends,
# with its ten slowest tests.
cluster-tests-%:
	$(DEVCLUSTER) up --slurm $*
	rc=0; $(DEVCLUSTER) exec --slurm $* -- env SLURMHET_REQUIRE_CLUSTER=1 SLURMHET_EXPECT_SLURM=$* \
	    SLURMHET_STATE_DIR=$(CURDIR)/$(if $(filter 22.05,$*),.state,.state-$*) \
	    SLURMHET_TEST_PG_URL="$$($(PGCLUSTER) url)" $(VENV)/bin/pytest -q --durations=10 tests/cluster || rc=$$?; \
	$(DEVCLUSTER) down --slurm $*; exit $$rc

## goldens: regenerate the golden sbatch scripts after an intended template change.
goldens: setup
	SLURMHET_REGEN_GOLDENS=1 $(VENV)/bin/pytest -q tests/unit/test_render_golden.py

clean:
	rm -rf $(VENV) .state .state-*
