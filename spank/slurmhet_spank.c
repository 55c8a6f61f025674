/*
 * slurmhet_spank.c - slurmhet's in-job behaviour inside Slurm itself (SPANK plugin).
 *
 * Options (srun, sbatch, salloc):
 *   --slurmhet-mps[=PERCENT]  job-private MPS pipe/log directories, CUDA_MPS_* for the tasks,
 *                             and one nvidia-cuda-mps-control daemon per job and node when the
 *                             program exists on the job's PATH.
 *   --slurmhet-job=ID         exports SLURMHET_JOB_ID (the slurmhet store's job id).
 * With --slurmhet-mps, SLURMHET_MPS_DAEMON=1|0 says whether a daemon serves the directories.
 * Always (every step with GPUs): SLURMHET_GPU_TYPE, the type(s) of the GPUs allocated on this
 * node, found by mapping SLURM_STEP_GPUS / SLURM_JOB_GPUS (node-local GPU indexes) through this
 * node's Name=gpu lines in gres.conf.
 *
 * plugstack.conf arguments (all optional; a bad one is logged and replaced by its default):
 *   default_mps=PERCENT   percentage for a bare --slurmhet-mps (1..100, default 100)
 *   base_dir=PATH         root of the per-job directories (absolute, default /run/slurmhet)
 *   gres_conf=PATH        gres.conf to read GPU types from (absolute, default /etc/slurm/gres.conf)
 *   mps_control=NAME      MPS control program: a name looked up on the job's PATH or an
 *                         absolute path (default nvidia-cuda-mps-control)
 *   control_timeout=SEC   how long a start or quit of the daemon may take (1..600, default 30)
 *
 * MPS lifecycle, per (job, node): BASE/<jobid>.<node>/ is root-owned 0711 and holds a root-only
 * state file (lock, reference count, daemon flag) plus the user-owned 0700 mps-pipe/ and mps-log/.
 * Every step that uses --slurmhet-mps takes a reference in init_post_opt (as root, before
 * slurmstepd drops privileges); the first one starts the daemon as the job user.  Each step drops
 * its reference in slurm_spank_exit (which also runs after scancel); the last one sends `quit`
 * and removes the directories.  A job's steps that overlap on a node (the batch step and the
 * sruns inside it) therefore share one daemon.  As a safety net for a slurmstepd that died, the
 * extern step's exit (PrologFlags=Contain) and the job epilog quit any daemon that is still
 * marked running and remove the directories.
 *
 * Layout after NVIDIA's pyxis: one dispatch on spank_context() per callback, one option table.
 * The plugin never fails a job because of its own configuration: every callback returns 0
 * except for invalid user option values, which srun/sbatch reject up front.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(slurmhet, 1)

#define LOG_PREFIX "slurmhet_spank: "
#define GPU_TYPES_MAX 64
#define GPUS_MAX 256
#define STEP_EXTERN 0xfffffffcU /* SLURM_EXTERN_CONT */
#define STEP_BATCH 0xfffffffbU  /* SLURM_BATCH_SCRIPT */

/* ------------------------------------------------------------------ configuration */

struct config {
	int default_mps;
	char base_dir[PATH_MAX];
	char gres_conf[PATH_MAX];
	char mps_control[PATH_MAX];
	int control_timeout;
};

static struct config cfg;

/* Option values as the callbacks saw them. */
static struct {
	int mps_requested;
	int mps_percent; /* 0: use cfg.default_mps */
	char job[32];
} opt;

/* What this slurmstepd did, so its exit undoes exactly that. */
static struct {
	int holds_ref;
	int daemon; /* a daemon serves this job on this node (ours or an earlier step's) */
	char job_dir[PATH_MAX];
	char pipe_dir[PATH_MAX];
	char log_dir[PATH_MAX];
	char node[256];
	uint32_t job_id;
	uid_t uid;
	gid_t gid;
} me;

static void config_defaults(void)
{
	memset(&cfg, 0, sizeof(cfg));
	cfg.default_mps = 100;
	snprintf(cfg.base_dir, sizeof(cfg.base_dir), "%s", "/run/slurmhet");
	snprintf(cfg.gres_conf, sizeof(cfg.gres_conf), "%s", "/etc/slurm/gres.conf");
	snprintf(cfg.mps_control, sizeof(cfg.mps_control), "%s", "nvidia-cuda-mps-control");
	cfg.control_timeout = 30;
}

/* Plugin configuration problems go to slurmd's log (remote, slurmd and job script contexts);
 * in srun/sbatch they are only verbose messages, so users are not told about site config. */
static void config_error(const char *fmt, const char *a, const char *b)
{
	spank_context_t ctx = spank_context();
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR)
		slurm_verbose(LOG_PREFIX "plugstack.conf: %s %s%s", fmt, a, b);
	else
		slurm_error(LOG_PREFIX "plugstack.conf: %s %s%s", fmt, a, b);
}

/* Parse a whole decimal number in [lo, hi]; -1 when it is not one. */
static long parse_int(const char *s, long lo, long hi)
{
	char *end = NULL;
	long v;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	return v;
}

static int valid_abs_path(const char *s)
{
	size_t n = strlen(s);
	return n > 1 && n < PATH_MAX - 64 && s[0] == '/' && !strstr(s, "/../") &&
	       !(n >= 3 && strcmp(s + n - 3, "/..") == 0);
}

static void config_parse(int ac, char **av)
{
	config_defaults();
	for (int i = 0; i < ac; i++) {
		const char *arg = av[i];
		const char *eq = strchr(arg, '=');
		const char *val = eq ? eq + 1 : "";
		size_t klen = eq ? (size_t)(eq - arg) : strlen(arg);
		long v;

#define KEY(k) (klen == strlen(k) && strncmp(arg, k, klen) == 0)
		if (!eq) {
			config_error("bad argument", arg, ": ignored, expected KEY=VALUE (default_mps, base_dir, gres_conf, mps_control, control_timeout)");
		} else if (KEY("default_mps")) {
			if ((v = parse_int(val, 1, 100)) < 0)
				config_error("bad argument", arg, ": default_mps must be a whole number in 1..100; ignored");
			else
				cfg.default_mps = (int)v;
		} else if (KEY("control_timeout")) {
			if ((v = parse_int(val, 1, 600)) < 0)
				config_error("bad argument", arg, ": control_timeout must be 1..600 seconds; ignored");
			else
				cfg.control_timeout = (int)v;
		} else if (KEY("base_dir")) {
			if (!valid_abs_path(val))
				config_error("bad argument", arg, ": base_dir must be an absolute path; ignored");
			else
				snprintf(cfg.base_dir, sizeof(cfg.base_dir), "%s", val);
		} else if (KEY("gres_conf")) {
			if (!valid_abs_path(val))
				config_error("bad argument", arg, ": gres_conf must be an absolute path; ignored");
			else
				snprintf(cfg.gres_conf, sizeof(cfg.gres_conf), "%s", val);
		} else if (KEY("mps_control")) {
			if (!*val || strlen(val) >= sizeof(cfg.mps_control) - 1 ||
			    (val[0] != '/' && strchr(val, '/')))
				config_error("bad argument", arg, ": mps_control must be a program name or an absolute path; ignored");
			else
				snprintf(cfg.mps_control, sizeof(cfg.mps_control), "%s", val);
		} else {
			config_error("unknown argument", arg, ": ignored; known are default_mps, base_dir, gres_conf, mps_control, control_timeout");
		}
#undef KEY
	}
	/* Drop trailing slashes so paths compose cleanly. */
	for (size_t n = strlen(cfg.base_dir); n > 1 && cfg.base_dir[n - 1] == '/'; n--)
		cfg.base_dir[n - 1] = '\0';
}

/* ------------------------------------------------------------------------ options */

static int opt_mps_cb(int val, const char *optarg, int remote);
static int opt_job_cb(int val, const char *optarg, int remote);

static struct spank_option slurmhet_options[] = {
	{ "slurmhet-mps", "[PERCENT]",
	  "slurmhet: job-private CUDA MPS (pipe/log dirs, per-node daemon if available), "
	  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=PERCENT (1-100)",
	  2, 0, opt_mps_cb },
	{ "slurmhet-job", "ID", "slurmhet: the slurmhet job id this Slurm job runs (exports SLURMHET_JOB_ID)",
	  1, 0, opt_job_cb },
	SPANK_OPTIONS_TABLE_END
};

static int opt_mps_cb(int val, const char *optarg, int remote)
{
	long v = 0;

	(void)val;
	if (optarg && *optarg && (v = parse_int(optarg, 1, 100)) < 0) {
		if (!remote)
			slurm_error("--slurmhet-mps: PERCENT must be a whole number in 1..100, got '%s'", optarg);
		return -1;
	}
	opt.mps_requested = 1;
	opt.mps_percent = (int)v;
	return 0;
}

static int opt_job_cb(int val, const char *optarg, int remote)
{
	(void)val;
	if (!optarg || parse_int(optarg, 1, 999999999999L) < 0 || strlen(optarg) >= sizeof(opt.job)) {
		if (!remote)
			slurm_error("--slurmhet-job: ID must be a positive whole number, got '%s'",
				    optarg ? optarg : "");
		return -1;
	}
	snprintf(opt.job, sizeof(opt.job), "%s", optarg);
	return 0;
}

static int options_register(spank_t sp)
{
	for (struct spank_option *o = slurmhet_options; o->name; o++) {
		spank_err_t rc = spank_option_register(sp, o);
		if (rc != ESPANK_SUCCESS)
			slurm_error(LOG_PREFIX "cannot register --%s: %s", o->name, spank_strerror(rc));
	}
	return 0;
}

/* -------------------------------------------------------------------- small helpers */

static int step_getenv(spank_t sp, const char *name, char *buf, int len)
{
	buf[0] = '\0';
	return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS && buf[0];
}

/* The node this slurmstepd serves.  Several slurmd may share a host (multiple-slurmd builds, the
 * dev cluster), so gethostname() is only the last resort: slurmd exports SLURMD_NODENAME into its
 * own environment, which slurmstepd and the job scripts inherit. */
static void node_name(spank_t sp, char *buf, size_t len)
{
	const char *env = getenv("SLURMD_NODENAME");
	char tmp[256];

	if (env && *env) {
		snprintf(buf, len, "%s", env);
	} else if (sp && step_getenv(sp, "SLURMD_NODENAME", tmp, sizeof(tmp))) {
		snprintf(buf, len, "%s", tmp);
	} else if (gethostname(tmp, sizeof(tmp)) == 0) {
		tmp[sizeof(tmp) - 1] = '\0';
		tmp[strcspn(tmp, ".")] = '\0';
		snprintf(buf, len, "%s", tmp);
	} else {
		snprintf(buf, len, "unknown");
	}
	/* A node name becomes part of a path: keep it to a safe alphabet. */
	for (char *p = buf; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
			*p = '_';
}

/* dir + "/" + name into out; -1 (and an empty out) when it does not fit. */
static int pjoin(char *out, size_t len, const char *dir, const char *name)
{
	int n = snprintf(out, len, "%s/%s", dir, name);

	if (n < 0 || (size_t)n >= len) {
		if (len)
			out[0] = '\0';
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- gres.conf -> GPU type */

/* Does one hostlist item ("nodea", "node[01-04,7]x", "node*" is not supported) name `node`? */
static int host_item_match(const char *item, const char *node)
{
	const char *lb = strchr(item, '[');
	const char *rb = lb ? strchr(lb, ']') : NULL;
	size_t plen, slen, nlen = strlen(node);
	char ranges[256];

	if (!lb || !rb)
		return strcmp(item, node) == 0;
	plen = (size_t)(lb - item);
	slen = strlen(rb + 1);
	if (nlen <= plen + slen || strncmp(item, node, plen) != 0 || strcmp(node + nlen - slen, rb + 1) != 0)
		return 0;
	/* The part of `node` between prefix and suffix must be a number inside one of the ranges. */
	char num[64];
	size_t numlen = nlen - plen - slen;
	if (numlen >= sizeof(num))
		return 0;
	memcpy(num, node + plen, numlen);
	num[numlen] = '\0';
	for (size_t i = 0; i < numlen; i++)
		if (!isdigit((unsigned char)num[i]))
			return 0;
	long n = strtol(num, NULL, 10);
	size_t rlen = (size_t)(rb - lb - 1);
	if (rlen >= sizeof(ranges))
		return 0;
	memcpy(ranges, lb + 1, rlen);
	ranges[rlen] = '\0';
	char *save = NULL;
	for (char *r = strtok_r(ranges, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(r, '-');
		long lo = strtol(r, NULL, 10), hi = dash ? strtol(dash + 1, NULL, 10) : lo;
		/* Zero-padded ranges must match in width ("node[01-10]" does not name "node1"). */
		size_t width = dash ? (size_t)(dash - r) : strlen(r);
		if (r[0] == '0' && width > 1 && numlen != width)
			continue;
		if (n >= lo && n <= hi)
			return 1;
	}
	return 0;
}

/* Split at commas that are not inside brackets. */
static int hostlist_match(const char *list, const char *node)
{
	char item[256];
	size_t k = 0;
	int depth = 0;

	for (const char *p = list;; p++) {
		if (*p == '[')
			depth++;
		else if (*p == ']')
			depth--;
		if ((*p == ',' && depth == 0) || *p == '\0') {
			item[k] = '\0';
			if (k && host_item_match(item, node))
				return 1;
			k = 0;
			if (!*p)
				return 0;
			continue;
		}
		if (k < sizeof(item) - 1)
			item[k++] = *p;
	}
}

/* How many devices one File= item names: "/dev/nvidia[0-3]" -> 4, "/dev/nvidia0" -> 1. */
static int file_item_count(const char *item)
{
	const char *lb = strchr(item, '['), *rb = lb ? strchr(lb, ']') : NULL;
	char ranges[256];
	size_t rlen;
	int n = 0;

	if (!lb)
		return 1;
	if (!rb || (rlen = (size_t)(rb - lb - 1)) >= sizeof(ranges))
		return -1;
	memcpy(ranges, lb + 1, rlen);
	ranges[rlen] = '\0';
	char *save = NULL;
	for (char *r = strtok_r(ranges, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(r, '-');
		long lo = strtol(r, NULL, 10), hi = dash ? strtol(dash + 1, NULL, 10) : lo;
		if (hi < lo || hi - lo >= GPUS_MAX)
			return -1;
		n += (int)(hi - lo + 1);
	}
	return n;
}

/* How many devices a File= value names ("/dev/nvidia[0-1],/dev/nvidia3" -> 3). */
static int file_count(const char *files)
{
	char item[PATH_MAX];
	size_t k = 0;
	int depth = 0, count = 0;

	for (const char *p = files;; p++) {
		if (*p == '[')
			depth++;
		else if (*p == ']')
			depth--;
		if ((*p == ',' && depth == 0) || *p == '\0') {
			item[k] = '\0';
			if (k) {
				int n = file_item_count(item);
				if (n < 0)
					return -1;
				count += n;
			}
			k = 0;
			if (!*p)
				return count;
			continue;
		}
		if (k < sizeof(item) - 1)
			item[k++] = *p;
	}
}

/* Fill types[i] with the type of this node's GPU index i (gres.conf order); returns the count. */
static int gres_gpu_types(const char *path, const char *node, char types[][GPU_TYPES_MAX], int max)
{
	FILE *f = fopen(path, "re");
	char line[4096];
	int n = 0;

	if (!f) {
		slurm_error(LOG_PREFIX "cannot read %s (plugstack.conf gres_conf=): %m; SLURMHET_GPU_TYPE is not set", path);
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#');
		char *nodes = NULL, *name = NULL, *type = NULL, *file = NULL, *countv = NULL;
		char *save = NULL;

		if (hash)
			*hash = '\0';
		for (char *tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
			char *eq = strchr(tok, '=');
			if (!eq)
				continue;
			*eq = '\0';
			if (!strcasecmp(tok, "NodeName"))
				nodes = eq + 1;
			else if (!strcasecmp(tok, "Name"))
				name = eq + 1;
			else if (!strcasecmp(tok, "Type"))
				type = eq + 1;
			else if (!strcasecmp(tok, "File") || !strcasecmp(tok, "MultipleFiles"))
				file = eq + 1;
			else if (!strcasecmp(tok, "Count"))
				countv = eq + 1;
		}
		if (!name || strcmp(name, "gpu") != 0)
			continue;
		if (nodes && !hostlist_match(nodes, node))
			continue;
		int count = file ? file_count(file) : (countv ? (int)parse_int(countv, 1, GPUS_MAX) : 1);
		if (count < 1) {
			slurm_error(LOG_PREFIX "%s: cannot count the GPUs of a Name=gpu line for %s", path, node);
			continue;
		}
		for (int i = 0; i < count && n < max; i++, n++)
			snprintf(types[n], GPU_TYPES_MAX, "%s", type && *type ? type : "");
	}
	fclose(f);
	return n;
}

/* "v100" for the GPUs in `indexes` ("0,3" or "0-1"); several types are joined with ','. */
static int gpu_type_for(const char *indexes, const char *node, char *out, size_t outlen)
{
	static char types[GPUS_MAX][GPU_TYPES_MAX];
	char list[1024];
	int n = gres_gpu_types(cfg.gres_conf, node, types, GPUS_MAX);

	out[0] = '\0';
	if (n <= 0) {
		if (n == 0)
			slurm_info(LOG_PREFIX "%s has no Name=gpu lines for node %s; SLURMHET_GPU_TYPE is not set",
				   cfg.gres_conf, node);
		return -1;
	}
	snprintf(list, sizeof(list), "%s", indexes);
	char *save = NULL;
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(tok, '-');
		long lo = parse_int(dash ? (*dash = '\0', tok) : tok, 0, GPUS_MAX - 1);
		long hi = dash ? parse_int(dash + 1, 0, GPUS_MAX - 1) : lo;
		if (lo < 0 || hi < lo) {
			slurm_error(LOG_PREFIX "cannot parse GPU indexes '%s'", indexes);
			return -1;
		}
		for (long i = lo; i <= hi; i++) {
			if (i >= n || !types[i][0]) {
				slurm_info(LOG_PREFIX "GPU index %ld on %s has no Type= in %s", i, node, cfg.gres_conf);
				continue;
			}
			/* Append unless already listed. */
			size_t tl = strlen(types[i]);
			int seen = 0;
			for (const char *p = out; *p;) {
				size_t l = strcspn(p, ",");
				if (l == tl && strncmp(p, types[i], tl) == 0)
					seen = 1;
				p += l + (p[l] == ',');
			}
			if (!seen && strlen(out) + tl + 2 < outlen) {
				if (*out)
					strcat(out, ",");
				strcat(out, types[i]);
			}
		}
	}
	return *out ? 0 : -1;
}

static void export_gpu_type(spank_t sp, uint32_t job_id, uint32_t step_id)
{
	char idx[1024], type[512], node[256];

	if (!step_getenv(sp, "SLURM_STEP_GPUS", idx, sizeof(idx)) &&
	    !step_getenv(sp, "SLURM_JOB_GPUS", idx, sizeof(idx))) {
		slurm_debug(LOG_PREFIX "%u.%u: no GPUs allocated here, SLURMHET_GPU_TYPE not set", job_id, step_id);
		return;
	}
	node_name(sp, node, sizeof(node));
	if (gpu_type_for(idx, node, type, sizeof(type)) != 0)
		return;
	if (spank_setenv(sp, "SLURMHET_GPU_TYPE", type, 1) != ESPANK_SUCCESS)
		slurm_error(LOG_PREFIX "cannot set SLURMHET_GPU_TYPE");
	else
		slurm_debug(LOG_PREFIX "%u.%u on %s: GPUs %s are %s", job_id, step_id, node, idx, type);
}

/* ------------------------------------------------------------------- child processes */

/* Sleep-poll for `pid` for up to `seconds`, then SIGKILL it.  Returns the wait status or -1. */
static int wait_child(pid_t pid, int seconds)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	long loops = (long)seconds * 50;
	int status = 0;

	for (long i = 0; i <= loops; i++) {
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return status;
		if (r < 0 && errno != EINTR)
			return -1;
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}

static void close_fds_from(int lowfd)
{
#ifdef SYS_close_range
	if (syscall(SYS_close_range, (unsigned)lowfd, ~0U, 0) == 0)
		return;
#endif
	long max = sysconf(_SC_OPEN_MAX);
	for (long fd = lowfd; fd < (max > 0 ? max : 4096); fd++)
		close((int)fd);
}

/* In a fresh child: leave slurmstepd's fds, signal state and privileges behind. */
static int become_user(uid_t uid, gid_t gid)
{
	sigset_t none;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			signal(s, SIG_DFL);
	close_fds_from(3);
	if (geteuid() != 0 && seteuid(0) != 0)
		return -1;
	if (setgroups(1, &gid) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
		return -1;
	return (getuid() == uid && geteuid() == uid) ? 0 : -1;
}

typedef int (*child_fn)(void *arg);

/* Run fn(arg) in a grandchild that is not a descendant of this process, and return its wait
 * status (-1: no result within `seconds`).  Slurm tears a step down by signalling its whole
 * process tree (proctrack/linuxproc) while slurm_spank_exit may still be running; a plain child
 * would be killed half-way through sending `quit` or removing the directories. */
static int run_detached(child_fn fn, void *arg, int seconds)
{
	int sp[2], status = -1;
	pid_t p1;

	if (pipe2(sp, O_CLOEXEC) != 0)
		return -1;
	p1 = fork();
	if (p1 < 0) {
		close(sp[0]);
		close(sp[1]);
		return -1;
	}
	if (p1 == 0) {
		pid_t p2, p3;
		close(sp[0]);
		setsid();
		p2 = fork();
		if (p2 != 0)
			_exit(p2 < 0); /* the waiter below is re-parented to init */
		p3 = fork();
		if (p3 == 0) {
			close(sp[1]);
			_exit(fn(arg));
		}
		if (p3 > 0)
			status = wait_child(p3, seconds);
		if (write(sp[1], &status, sizeof(status)) < 0)
			_exit(1);
		_exit(0);
	}
	close(sp[1]);
	waitpid(p1, NULL, 0);
	struct pollfd pfd = { .fd = sp[0], .events = POLLIN };
	int left_ms = (seconds + 5) * 1000;
	while (left_ms > 0) {
		int r = poll(&pfd, 1, 200);
		if (r > 0) {
			if (read(sp[0], &status, sizeof(status)) != sizeof(status))
				status = -1;
			break;
		}
		if (r < 0 && errno != EINTR)
			break;
		left_ms -= 200;
	}
	close(sp[0]);
	return status;
}

/* Exit code of a wait status; -1 for "no result". */
static int exit_code(int status)
{
	if (status < 0)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct exec_req {
	const char *path;
	char *const *argv;
	char **env;
	const char *input; /* short text for stdin, or NULL for /dev/null */
	const char *out_file;
	uid_t uid;
	gid_t gid;
};

static int exec_child(void *arg)
{
	struct exec_req *r = arg;
	int fd, in[2];

	if (r->input && pipe(in) == 0) {
		/* A few bytes always fit into the pipe buffer, so this cannot block. */
		if (write(in[1], r->input, strlen(r->input)) < 0)
			return 125;
		close(in[1]);
		dup2(in[0], 0);
	} else if ((fd = open("/dev/null", O_RDONLY)) >= 0) {
		dup2(fd, 0);
	}
	if (become_user(r->uid, r->gid) != 0)
		return 126;
	fd = r->out_file ? open(r->out_file, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
	if (fd < 0)
		fd = open("/dev/null", O_WRONLY);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	if (chdir("/") != 0)
		return 126;
	execve(r->path, r->argv, r->env);
	return 127;
}

/* Run `path argv...` as the job user with `env`; returns its exit code, or -1. */
static int run_as_user(const char *path, char *const argv[], char **env, const char *input,
		       const char *out_file, uid_t uid, gid_t gid)
{
	struct exec_req r = { path, argv, env, input, out_file, uid, gid };
	return exit_code(run_detached(exec_child, &r, cfg.control_timeout));
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		(void)rmdir(path);
	else
		(void)unlink(path);
	return 0;
}

struct rm_req {
	const char *job_dir;
	uid_t uid;
	gid_t gid;
};

static int rm_child(void *arg)
{
	struct rm_req *r = arg;
	char sub[PATH_MAX];

	if (become_user(r->uid, r->gid) != 0)
		return 126;
	if (pjoin(sub, sizeof(sub), r->job_dir, "mps-pipe") == 0)
		nftw(sub, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	if (pjoin(sub, sizeof(sub), r->job_dir, "mps-log") == 0)
		nftw(sub, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

/* Remove the user-owned directories as the user (root never walks a tree a user controls),
 * then the root-owned job directory itself. */
static void remove_job_dir(const char *job_dir, uid_t uid, gid_t gid)
{
	struct rm_req r = { job_dir, uid, gid };
	int dfd;

	(void)run_detached(rm_child, &r, cfg.control_timeout);
	dfd = open(job_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd >= 0) {
		/* What the user could not remove would be theirs: then rmdir just fails. */
		unlinkat(dfd, "mps-pipe", AT_REMOVEDIR);
		unlinkat(dfd, "mps-log", AT_REMOVEDIR);
		unlinkat(dfd, "daemon.env", 0);
		unlinkat(dfd, "state", 0);
		close(dfd);
	}
	if (rmdir(job_dir) != 0 && errno != ENOENT)
		slurm_error(LOG_PREFIX "cannot remove %s: %m", job_dir);
}

/* ------------------------------------------------------------------------ job state */

struct job_state {
	int refs;
	int daemon;
	uid_t uid;
	gid_t gid;
	char control[PATH_MAX];
};

static void job_paths(uint32_t job_id, const char *node)
{
	me.job_id = job_id;
	snprintf(me.node, sizeof(me.node), "%s", node);
	if (snprintf(me.job_dir, sizeof(me.job_dir), "%s/%u.%s", cfg.base_dir, job_id, node) >=
	    (int)sizeof(me.job_dir))
		me.job_dir[0] = '\0';
	(void)pjoin(me.pipe_dir, sizeof(me.pipe_dir), me.job_dir, "mps-pipe");
	(void)pjoin(me.log_dir, sizeof(me.log_dir), me.job_dir, "mps-log");
}

static int state_read(int fd, struct job_state *st)
{
	char buf[PATH_MAX + 256];
	ssize_t n;
	unsigned long uid = 0, gid = 0;

	memset(st, 0, sizeof(*st));
	if (lseek(fd, 0, SEEK_SET) < 0 || (n = read(fd, buf, sizeof(buf) - 1)) < 0)
		return -1;
	buf[n] = '\0';
	if (n == 0)
		return 0;
	if (sscanf(buf, "refs=%d daemon=%d uid=%lu gid=%lu control=%4095s", &st->refs, &st->daemon, &uid, &gid,
		   st->control) < 4)
		return -1;
	st->uid = (uid_t)uid;
	st->gid = (gid_t)gid;
	return 0;
}

static int state_write(int fd, const struct job_state *st)
{
	char buf[PATH_MAX + 256];
	int len = snprintf(buf, sizeof(buf), "refs=%d daemon=%d uid=%lu gid=%lu control=%s\n", st->refs, st->daemon,
			   (unsigned long)st->uid, (unsigned long)st->gid, st->control[0] ? st->control : "-");

	if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)len, 0) != len)
		return -1;
	return 0;
}

/* mkdir + verify: a real directory (not a symlink), owned by `uid`, mode exactly `mode`. */
static int ensure_dir(const char *path, mode_t mode, uid_t uid, gid_t gid)
{
	struct stat st;
	int fd;

	if (mkdir(path, mode) != 0 && errno != EEXIST) {
		slurm_error(LOG_PREFIX "cannot create %s: %m", path);
		return -1;
	}
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		slurm_error(LOG_PREFIX "%s is not a directory: %m", path);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (st.st_uid != uid && st.st_uid == 0 && fchown(fd, uid, gid) == 0)
		st.st_uid = uid;
	if (st.st_uid != uid) {
		slurm_error(LOG_PREFIX "%s belongs to uid %lu, expected %lu; refusing to use it", path,
			    (unsigned long)st.st_uid, (unsigned long)uid);
		close(fd);
		return -1;
	}
	if ((st.st_mode & 07777) != mode)
		fchmod(fd, mode);
	close(fd);
	return 0;
}

/* Open and lock BASE/<job>.<node>/state (root-only).  `create`: make the directories first. */
static int state_open(int create)
{
	char path[PATH_MAX];
	int fd, retries = 0;

again:
	if (create) {
		if (ensure_dir(cfg.base_dir, 0711, 0, 0) != 0 || ensure_dir(me.job_dir, 0711, 0, 0) != 0)
			return -1;
	}
	(void)pjoin(path, sizeof(path), me.job_dir, "state");
	fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
	if (fd < 0) {
		if (create || errno != ENOENT)
			slurm_error(LOG_PREFIX "cannot open %s: %m", path);
		return -1;
	}
	while (flock(fd, LOCK_EX) != 0) {
		if (errno != EINTR) {
			close(fd);
			return -1;
		}
	}
	/* Whoever held the lock may have removed the job directory meanwhile. */
	struct stat sb;
	if (fstat(fd, &sb) != 0 || sb.st_nlink == 0) {
		close(fd);
		if (create && retries++ < 3)
			goto again;
		return -1;
	}
	return fd;
}

/* --------------------------------------------------------------------- MPS daemon */

/* Resolve the control program: an absolute path, or a name on the job's PATH. */
static int find_control(spank_t sp, char *out, size_t len)
{
	char path[8192];

	if (cfg.mps_control[0] == '/') {
		snprintf(out, len, "%s", cfg.mps_control);
		return access(out, X_OK) == 0 ? 0 : -1;
	}
	if (!step_getenv(sp, "PATH", path, sizeof(path)))
		snprintf(path, sizeof(path), "%s", "/usr/local/bin:/usr/bin:/bin");
	char *save = NULL;
	for (char *dir = strtok_r(path, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		struct stat st;
		if (dir[0] != '/')
			continue; /* relative PATH entries would depend on slurmstepd's cwd */
		if (pjoin(out, len, dir, cfg.mps_control) != 0)
			continue;
		if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
			return 0;
	}
	out[0] = '\0';
	return -1;
}

/* The daemon's environment: the job's, plus the MPS directories.  Saved (root-only) so that a
 * quit from the extern step or the epilog, which have no job environment, uses the same one. */
static char **daemon_env(spank_t sp)
{
	char **job_env = NULL, **env;
	size_t n = 0, k = 0;

	if (sp && spank_get_item(sp, S_JOB_ENV, &job_env) != ESPANK_SUCCESS)
		job_env = NULL;
	for (char **e = job_env; e && *e; e++)
		n++;
	env = calloc(n + 3, sizeof(char *));
	if (!env)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (strncmp(job_env[i], "CUDA_MPS_PIPE_DIRECTORY=", 24) && strncmp(job_env[i], "CUDA_MPS_LOG_DIRECTORY=", 23))
			env[k++] = strdup(job_env[i]);
	if (asprintf(&env[k++], "CUDA_MPS_PIPE_DIRECTORY=%s", me.pipe_dir) < 0 ||
	    asprintf(&env[k++], "CUDA_MPS_LOG_DIRECTORY=%s", me.log_dir) < 0)
		env[--k] = NULL;
	return env;
}

static void env_free(char **env)
{
	for (char **e = env; e && *e; e++)
		free(*e);
	free(env);
}

static void env_save(char **env)
{
	char path[PATH_MAX];
	int fd;

	(void)pjoin(path, sizeof(path), me.job_dir, "daemon.env");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	for (char **e = env; e && *e; e++)
		if (write(fd, *e, strlen(*e) + 1) < 0)
			break;
	close(fd);
}

static char **env_load(void)
{
	char path[PATH_MAX], *buf = NULL, **env;
	size_t cap = 0, len = 0, n = 0;
	int fd;

	(void)pjoin(path, sizeof(path), me.job_dir, "daemon.env");
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0) {
		for (;;) {
			if (len + 4096 > cap) {
				char *nb = realloc(buf, cap = len + 65536);
				if (!nb)
					break;
				buf = nb;
			}
			ssize_t r = read(fd, buf + len, cap - len - 1);
			if (r <= 0)
				break;
			len += (size_t)r;
		}
		close(fd);
	}
	for (size_t i = 0; i < len; i++)
		n += buf[i] == '\0';
	env = calloc(n + 3, sizeof(char *));
	if (!env) {
		free(buf);
		return NULL;
	}
	n = 0;
	for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
		env[n++] = strdup(buf + i);
	free(buf);
	if (n == 0) {
		env[n++] = strdup("PATH=/usr/local/bin:/usr/bin:/bin");
		if (asprintf(&env[n++], "CUDA_MPS_PIPE_DIRECTORY=%s", me.pipe_dir) < 0 ||
		    asprintf(&env[n++], "CUDA_MPS_LOG_DIRECTORY=%s", me.log_dir) < 0)
			env[--n] = NULL;
	}
	return env;
}

static void daemon_quit(struct job_state *st, char **env, const char *why)
{
	char out[PATH_MAX];
	char *argv[] = { st->control, NULL };
	int rc;

	(void)pjoin(out, sizeof(out), me.log_dir, "slurmhet-control.out");
	rc = run_as_user(st->control, argv, env, "quit\n", out, st->uid, st->gid);
	if (rc == 0)
		slurm_info(LOG_PREFIX "job %u on %s: MPS control daemon stopped (%s)", me.job_id, me.node, why);
	else
		slurm_error(LOG_PREFIX "job %u on %s: `%s` quit returned %d (%s)", me.job_id, me.node, st->control, rc,
			    why);
	st->daemon = 0;
}

/* Remote context, as root, before privileges are dropped: take this step's reference and start
 * the daemon if it is the first one on this node. */
static void mps_setup(spank_t sp, uint32_t job_id, uint32_t step_id)
{
	struct job_state st;
	char node[256];
	uid_t uid;
	gid_t gid;
	int fd;

	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
		slurm_error(LOG_PREFIX "%u.%u: cannot get the job's uid/gid; MPS setup skipped", job_id, step_id);
		return;
	}
	node_name(sp, node, sizeof(node));
	job_paths(job_id, node);
	me.uid = uid;
	me.gid = gid;
	if ((fd = state_open(1)) < 0)
		return;
	if (state_read(fd, &st) != 0 || (st.refs && st.uid != uid)) {
		slurm_error(LOG_PREFIX "%s/state is corrupt; MPS setup skipped", me.job_dir);
		close(fd);
		return;
	}
	if (ensure_dir(me.pipe_dir, 0700, uid, gid) != 0 || ensure_dir(me.log_dir, 0700, uid, gid) != 0) {
		close(fd);
		return;
	}
	st.uid = uid;
	st.gid = gid;
	st.refs++;
	me.holds_ref = 1;
	if (!st.daemon) {
		char control[PATH_MAX];
		if (find_control(sp, control, sizeof(control)) != 0) {
			if (st.refs == 1)
				slurm_info(LOG_PREFIX "job %u on %s: %s not found (job PATH); MPS is not available, "
					   "tasks run without an MPS daemon", job_id, node, cfg.mps_control);
		} else {
			char **env = daemon_env(sp);
			char out[PATH_MAX];
			char *argv[] = { control, "-d", NULL };
			(void)pjoin(out, sizeof(out), me.log_dir, "slurmhet-control.out");
			int rc = env ? run_as_user(control, argv, env, NULL, out, uid, gid) : -1;
			if (rc == 0) {
				st.daemon = 1;
				snprintf(st.control, sizeof(st.control), "%s", control);
				env_save(env);
				slurm_info(LOG_PREFIX "job %u on %s: MPS control daemon started (%s, pipe %s)", job_id,
					   node, control, me.pipe_dir);
			} else {
				slurm_error(LOG_PREFIX "job %u on %s: `%s -d` failed (status %d); MPS is not active",
					    job_id, node, control, rc);
			}
			env_free(env);
		}
	}
	me.daemon = st.daemon;
	if (state_write(fd, &st) != 0)
		slurm_error(LOG_PREFIX "cannot write %s/state: %m", me.job_dir);
	close(fd);
}

/* Drop this step's reference; the last one quits the daemon and removes the directories. */
static void mps_release(void)
{
	struct job_state st;
	int fd;

	if (!me.holds_ref)
		return;
	me.holds_ref = 0;
	if ((fd = state_open(0)) < 0)
		return;
	if (state_read(fd, &st) != 0) {
		close(fd);
		return;
	}
	if (st.refs > 0)
		st.refs--;
	if (st.refs == 0) {
		if (st.daemon) {
			char **env = env_load();
			daemon_quit(&st, env, "last step on the node ended");
			env_free(env);
		}
		remove_job_dir(me.job_dir, st.uid, st.gid);
	} else if (state_write(fd, &st) != 0) {
		slurm_error(LOG_PREFIX "cannot write %s/state: %m", me.job_dir);
	}
	close(fd);
}

/* Job end (extern step exit, job epilog): whatever is left of this job on this node goes. */
static void job_cleanup(uint32_t job_id, const char *why)
{
	struct job_state st;
	char node[256];
	struct stat sb;
	int fd;

	node_name(NULL, node, sizeof(node));
	job_paths(job_id, node);
	if (lstat(me.job_dir, &sb) != 0)
		return;
	if ((fd = state_open(0)) < 0) {
		return;
	}
	if (state_read(fd, &st) == 0) {
		if (st.daemon) {
			char **env = env_load();
			daemon_quit(&st, env, why);
			env_free(env);
		}
		remove_job_dir(me.job_dir, st.uid, st.gid);
		slurm_info(LOG_PREFIX "job %u on %s: removed leftover %s (%s)", job_id, node, me.job_dir, why);
	}
	close(fd);
}

/* ------------------------------------------------------------------ remote context */

static int remote_post_opt(spank_t sp)
{
	uint32_t job_id = 0, step_id = 0;

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS)
		return 0;
	if (step_id == STEP_EXTERN || !opt.mps_requested)
		return 0;
	mps_setup(sp, job_id, step_id);
	return 0;
}

static int remote_user_init(spank_t sp)
{
	uint32_t job_id = 0, step_id = 0;
	char pct[16];

	spank_get_item(sp, S_JOB_ID, &job_id);
	spank_get_item(sp, S_JOB_STEPID, &step_id);
	export_gpu_type(sp, job_id, step_id);
	if (opt.job[0] && spank_setenv(sp, "SLURMHET_JOB_ID", opt.job, 1) != ESPANK_SUCCESS)
		slurm_error(LOG_PREFIX "cannot set SLURMHET_JOB_ID");
	if (opt.mps_requested) {
		snprintf(pct, sizeof(pct), "%d", opt.mps_percent ? opt.mps_percent : cfg.default_mps);
		spank_setenv(sp, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", pct, 1);
		if (me.holds_ref) {
			spank_setenv(sp, "CUDA_MPS_PIPE_DIRECTORY", me.pipe_dir, 1);
			spank_setenv(sp, "CUDA_MPS_LOG_DIRECTORY", me.log_dir, 1);
		}
		/* Tells slurmhet's run-pack that a daemon already serves these directories. */
		spank_setenv(sp, "SLURMHET_MPS_DAEMON", me.daemon ? "1" : "0", 1);
	}
	return 0;
}

static int remote_exit(spank_t sp)
{
	uint32_t job_id = 0, step_id = 0;

	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS)
		return 0;
	if (step_id == STEP_EXTERN)
		job_cleanup(job_id, "job ended (extern step)");
	else
		mps_release();
	return 0;
}

/* ------------------------------------------------------------------------- dispatch */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	config_parse(ac, av);
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
	case S_CTX_REMOTE:
		return options_register(sp);
	default:
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return remote_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return remote_user_init(sp);
	default:
		return 0;
	}
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return remote_exit(sp);
	default:
		return 0;
	}
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0;

	(void)ac;
	(void)av;
	if (spank_context() == S_CTX_JOB_SCRIPT && spank_get_item(sp, S_JOB_ID, &job_id) == ESPANK_SUCCESS)
		job_cleanup(job_id, "job epilog");
	return 0; /* an epilog error would drain the node */
}
