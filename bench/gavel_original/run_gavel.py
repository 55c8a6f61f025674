#!/usr/bin/env python
"""Wrapper around Gavel's unmodified driver
scheduler/scripts/drivers/simulate_scheduler_with_trace.py.

Usage: run_gavel.py OUT_JSON -- <driver args...>

It imports Gavel's modules, wraps (monkeypatches, in memory only) a few
Scheduler methods to record per-round assignments, allocations and per-job
records, then runs the driver file itself as __main__ (runpy) with the given
args. Afterwards it dumps a JSON file. No Gavel file is modified.
"""
import json
import os
import runpy
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
GAVEL = os.path.join(HERE, 'scheduler')
DRIVER = os.path.join(GAVEL, 'scripts', 'drivers',
                      'simulate_scheduler_with_trace.py')
sys.path.insert(0, GAVEL)
sys.path.insert(1, os.path.join(HERE, 'gen_stubs'))  # generated grpc stubs

import scheduler as gavel_scheduler  # noqa: E402  (Gavel's scheduler.py)

S = gavel_scheduler.Scheduler
REC = {'sched': None, 'rounds': [], 'allocations': [], 'jobs_added': {},
       'avg_jct': None}


def jid(j):
    return str(j)


orig_init = S.__init__


def init(self, *a, **k):
    orig_init(self, *a, **k)
    REC['sched'] = self


S.__init__ = init

orig_add_job = S.add_job


def add_job(self, job, timestamp=None):
    job_id = orig_add_job(self, job, timestamp=timestamp)
    REC['jobs_added'][job_id[0]] = {
        'job_type': job.job_type, 'scale_factor': job.scale_factor,
        'num_steps': job.total_steps, 'priority_weight': job.priority_weight,
        'arrival': timestamp}
    return job_id


S.add_job = add_job

orig_compute_allocation = S._compute_allocation


def compute_allocation(self, state=None):
    t0 = time.time()
    alloc = orig_compute_allocation(self, state)
    REC['allocations'].append({
        'time': self.get_current_timestamp(),
        'solve_wall_s': round(time.time() - t0, 4),
        'allocation': {jid(j): {w: float(v) for w, v in alloc[j].items()}
                       for j in sorted(alloc)}})
    return alloc


S._compute_allocation = compute_allocation

orig_schedule = S._schedule_jobs_on_workers


def schedule_jobs_on_workers(self):
    assignments = orig_schedule(self)
    rnd = {'start': self.get_current_timestamp(),
           'allocation_index': len(REC['allocations']) - 1,
           'jobs': []}
    for job_id, worker_ids in assignments.items():
        wt = self._worker_id_to_worker_type_mapping[worker_ids[0]]
        rnd['jobs'].append({
            'id': job_id[0], 'worker_type': wt, 'num_workers': len(worker_ids),
            'worker_ids': list(worker_ids),
            'priority': float(self._priorities[wt].get(job_id, float('nan'))),
            'deficit': float(self._deficits[wt].get(job_id, float('nan'))),
            'lease_extended': (job_id in self._current_worker_assignments and
                               set(self._current_worker_assignments[job_id])
                               == set(worker_ids))})
    REC['rounds'].append(rnd)
    return assignments


S._schedule_jobs_on_workers = schedule_jobs_on_workers

orig_steps = S._get_job_steps_and_finish_times


def get_job_steps_and_finish_times(self, job_id, worker_type):
    all_num_steps, max_finish_time = orig_steps(self, job_id, worker_type)
    if REC['rounds']:
        for e in REC['rounds'][-1]['jobs']:
            if e['id'] == job_id[0]:
                e['steps'] = [int(x) for x in all_num_steps]
                e['finish'] = float(max_finish_time)
    return all_num_steps, max_finish_time


S._get_job_steps_and_finish_times = get_job_steps_and_finish_times

orig_avg = S.get_average_jct


def get_average_jct(self, job_ids=None, verbose=True):
    r = orig_avg(self, job_ids, verbose)
    if REC['avg_jct'] is None:
        REC['avg_jct'] = r
    return r


S.get_average_jct = get_average_jct


def main():
    out = sys.argv[1]
    assert sys.argv[2] == '--'
    driver_args = sys.argv[3:]
    cmd = ' '.join([sys.executable, os.path.realpath(__file__)] + sys.argv[1:])
    t0 = time.time()
    sys.argv = [DRIVER] + driver_args
    runpy.run_path(DRIVER, run_name='__main__')
    wall = time.time() - t0
    s = REC['sched']
    jobs = []
    for i in sorted(REC['jobs_added']):
        info = REC['jobs_added'][i]
        key = [k for k in s._job_completion_times if k[0] == i]
        jct = s._job_completion_times[key[0]] if key else None
        jp = gavel_scheduler.job_id_pair.JobIdPair(i, None)
        jobs.append({
            'id': i, 'job_type': info['job_type'],
            'scale_factor': info['scale_factor'],
            'priority_weight': info['priority_weight'],
            'arrival': s._per_job_start_timestamps.get(jp),
            'completion': s._per_job_latest_timestamps.get(jp),
            'jct': jct, 'num_steps': info['num_steps']})
    res = {
        'avg_jct': float(REC['avg_jct']) if REC['avg_jct'] is not None else None,
        'makespan': float(s._current_timestamp),
        'cmd': cmd,
        'wall_s': round(wall, 1),
        'num_lease_extensions': s._num_lease_extensions,
        'num_lease_extension_opportunities':
            s._num_lease_extension_opportunities,
        'jobs': jobs,
        'rounds': REC['rounds'],
        'allocations': REC['allocations'],
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(res, f)
    print('WRAPPER: avg_jct=%.3f makespan=%.3f wall=%.1fs rounds=%d '
          'allocs=%d -> %s' % (res['avg_jct'], res['makespan'], wall,
                               len(res['rounds']), len(res['allocations']),
                               out))


if __name__ == '__main__':
    main()
