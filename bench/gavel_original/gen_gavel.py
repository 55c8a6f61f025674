#!/usr/bin/env python
"""Generate a continuous-arrival workload with Gavel's own job generator and
simulate it, dumping the generated trace and a JSON record.

Usage: gen_gavel.py OUT_JSON --rate JOBS_PER_HOUR --policy P [--num_jobs 120]
                   [--trace OUT_TRACE]

This mirrors simulate() in Gavel's unmodified
scheduler/scripts/drivers/simulate_scheduler_with_generated_jobs.py (same
Scheduler construction: policy via utils.get_policy(solver, seed), seed,
time_per_iteration=interval, simulate=True, profiling_percentage=1.0,
no prices / SLOs / global queue), but calls Scheduler.simulate with
num_total_jobs=N and jobs_to_complete=None: the driver cannot do this (with
lam != 0 it forces num_total_jobs=None and a -s/-e job-id window, in which
case generation continues past the window and the output trace holds more
than N jobs).

Gavel's lam is the MEAN INTER-ARRIVAL TIME in seconds
(Scheduler._sample_arrival_time_delta(1.0 / lam) draws Exp(rate=1/lam)),
so lam = 3600 / rate_per_hour.

The recording monkeypatches of run_gavel.py (in memory only) are applied by
importing it; no Gavel file is modified.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
GAVEL = os.path.join(HERE, 'scheduler')
sys.path.insert(0, HERE)
from run_gavel import REC, gavel_scheduler  # noqa: E402
import utils  # noqa: E402  (Gavel's utils.py)
from job_id_pair import JobIdPair  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('out_json')
    ap.add_argument('--rate', type=float, required=True, help='jobs/hour')
    ap.add_argument('--policy', required=True)
    ap.add_argument('--num_jobs', type=int, default=120)
    ap.add_argument('--trace', default=None)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('-c', '--cluster_spec', default='8:16:24')
    ap.add_argument('--num_gpus_per_server', default='1:1:1')
    ap.add_argument('--interval', type=int, default=360)
    ap.add_argument('--solver', default='ECOS')
    ap.add_argument('--throughputs_file',
                    default=os.path.join(GAVEL, 'simulation_throughputs.json'))
    a = ap.parse_args()
    a.out_json = os.path.abspath(a.out_json)
    if a.trace is not None:
        a.trace = os.path.abspath(a.trace)
    os.chdir(GAVEL)
    lam = 3600.0 / a.rate
    g = [int(x) for x in a.cluster_spec.split(':')]
    cluster_spec = {'v100': g[0], 'p100': g[1], 'k80': g[2]}
    s_ = [int(x) for x in a.num_gpus_per_server.split(':')]
    num_gpus_per_server = {'v100': s_[0], 'p100': s_[1], 'k80': s_[2]}

    policy = utils.get_policy(a.policy, solver=a.solver, seed=a.seed)
    sched = gavel_scheduler.Scheduler(
        policy, throughputs_file=a.throughputs_file, seed=a.seed,
        time_per_iteration=a.interval, simulate=True,
        profiling_percentage=1.0, per_instance_type_prices_dir=None,
        available_clouds=['aws', 'gcp', 'azure'], assign_SLOs=False,
        enable_global_queue=False)
    print('Configuration: cluster_spec=%s policy=%s seed=%d rate=%g/h '
          'lam=%f s num_total_jobs=%d' % (a.cluster_spec, policy.name, a.seed,
                                          a.rate, lam, a.num_jobs),
          file=sys.stderr)
    t0 = time.time()
    sched.simulate(cluster_spec, lam=lam, jobs_to_complete=None,
                   fixed_job_duration=None, generate_multi_gpu_jobs=True,
                   generate_multi_priority_jobs=False,
                   simulate_steady_state=False, num_total_jobs=a.num_jobs,
                   debug=False, checkpoint_threshold=None,
                   checkpoint_file=None,
                   num_gpus_per_server=num_gpus_per_server,
                   output_trace_file_name=a.trace)
    avg = sched.get_average_jct(None)
    util = sched.get_cluster_utilization()
    sched.get_num_lease_extensions()
    wall = time.time() - t0
    s = sched
    jobs = []
    for i in sorted(REC['jobs_added']):
        info = REC['jobs_added'][i]
        jp = JobIdPair(i, None)
        jct = s._job_completion_times.get(jp)
        job_obj = [j for (t, j) in s._all_jobs][i]
        jobs.append({
            'id': i, 'job_type': info['job_type'],
            'scale_factor': info['scale_factor'],
            'priority_weight': info['priority_weight'],
            'arrival': info['arrival'],
            'completion': s._per_job_latest_timestamps.get(jp),
            'jct': jct, 'num_steps': info['num_steps'],
            'duration_v100_s': job_obj.duration})
    res = {'avg_jct': float(avg), 'makespan': float(s._current_timestamp),
           'utilization': util, 'rate_per_hour': a.rate, 'lam_s': lam,
           'cmd': ' '.join([sys.executable] + sys.argv), 'wall_s': round(wall, 1),
           'num_lease_extensions': s._num_lease_extensions,
           'num_lease_extension_opportunities':
               s._num_lease_extension_opportunities,
           'jobs': jobs, 'rounds': REC['rounds'],
           'allocations': REC['allocations']}
    with open(a.out_json, 'w') as f:
        json.dump(res, f)
    print('WRAPPER: avg_jct=%.3f makespan=%.3f wall=%.1fs rounds=%d allocs=%d '
          '-> %s' % (res['avg_jct'], res['makespan'], wall, len(REC['rounds']),
                     len(REC['allocations']), a.out_json))


if __name__ == '__main__':
    main()
