// Source evaluated inside the script's vm context: the hooks a script sees (agent,
// workflow, phase, log, parallel, pipeline, race, waitN, bounded, budget, args) and the
// `__sb` object the runner drives. Uses the names CALLS and GUARDS define. The semantics
// are Claude Code's Workflow tool's (2.1.328) where it has the hook; race, waitN,
// bounded, budget.usd and budget.codex are SwarmBase's own.
export const HOOKS = String.raw`
  const isPlainObject = (o) => o !== null && typeof o === 'object' && !Array.isArray(o);

  function agent(prompt, opts) {
    if (typeof prompt !== 'string' || prompt.length === 0) {
      return Promise.reject(new TypeError('agent(prompt, opts): prompt must be a non-empty string'));
    }
    let o;
    try { o = plain(opts === undefined || opts === null ? {} : opts, 'agent() options'); }
    catch (e) { return Promise.reject(e); }
    if (!isPlainObject(o)) return Promise.reject(new TypeError('agent(prompt, opts): opts must be an object'));
    return call('agent', { prompt, opts: o });
  }

  // workflow(nameOrRef, args?, opts?): a saved workflow by name (Claude Code's form), or
  // { name }, { scriptPath }, or script text (SwarmBase's); the daemon tells a name from
  // script text (see runs/workflows.py). args stay undefined when not given.
  function workflow(source, args, opts) {
    const usage = 'workflow(nameOrRef, args, opts): ';
    let src, o;
    const payload = {};
    try {
      if (typeof source === 'string') {
        if (!source.trim()) throw new TypeError(usage + 'a workflow name (string) or {scriptPath} is needed');
        src = source;
      } else if (isPlainObject(source) && Object.keys(source).length === 1 &&
                 ((typeof source.name === 'string' && source.name) || (typeof source.scriptPath === 'string' && source.scriptPath))) {
        src = source.name !== undefined ? { name: source.name } : { scriptPath: source.scriptPath };
      } else {
        throw new TypeError('workflow() expects a workflow name (string) or {scriptPath: string}');
      }
      if (args !== undefined) payload.args = plain(args, 'workflow() args');
      o = plain(opts === undefined ? {} : opts, 'workflow() options');
      if (!isPlainObject(o)) throw new TypeError(usage + 'opts must be an object');
    } catch (e) { return Promise.reject(e); }
    return call('workflow', Object.assign({ source: src, opts: o }, payload));
  }

  function phase(title) { send({ t: 'phase', title: String(title) }); }
  function log(...parts) {
    send({ t: 'log', message: parts.map((p) => typeof p === 'string' ? p : JSON.stringify(p)).join(' ') });
  }
  const logWith = (prefix) => (...parts) => log(prefix + parts.map((p) => typeof p === 'string' ? p : JSON.stringify(p)).join(' '));

  const checkFunctions = (fns, usage, what) => {
    if (!Array.isArray(fns)) throw new TypeError(usage + ': ' + what + ' must be an array of functions');
    fns.forEach((f, i) => { if (typeof f !== 'function') throw new TypeError(usage + ': item ' + i + ' is not a function'); });
  };
  // Everything that can settle with a failure reports the first one in input order, with
  // a note of how many failed (see docs/decisions.md, "parallel() / pipeline() failure rule").
  function firstFailure(results, what, extra) {
    const failed = results.filter((r) => r && r.status === 'rejected');
    if (failed.length === 0) return null;
    const e = failed[0].reason;
    if (e && typeof e === 'object' && (failed.length > 1 || extra)) {
      try { e.message = e.message + ' (' + what + ': ' + failed.length + ' of ' + results.length + ' failed' + (extra || '') + ')'; } catch (_) {}
    }
    return e;
  }
  const settled = (ok, v) => ok ? { status: 'fulfilled', value: v } : { status: 'rejected', reason: v };
  const isValue = (v) => v !== null && v !== undefined;
  const messageOf = (e) => {
    try { return e && typeof e === 'object' && typeof e.message === 'string' ? e.message : String(e); }
    catch (_) { return '<unprintable thrown value>'; }
  };
  const nameOf = (e) => { try { return e && typeof e === 'object' ? String(e.name) : ''; } catch (_) { return ''; } };

  // Claude Code's rule for parallel() and pipeline(): the call itself throws only when it
  // cannot start (not an array, a non-function, the run's agent cap or token target
  // already reached); a thunk or stage that throws becomes null in the results and is
  // logged, and the others go on. A budget stop inside is dropped silently (null), the
  // way Claude Code drops a slot when the token budget is exceeded.
  const fatalNow = () => {
    const v = budgetView;
    if (v.maxAgents !== undefined && v.agents >= v.maxAgents) {
      throw Object.assign(new Error('agent(): this run reached its cap of ' + v.maxAgents + ' agents (maxAgentsPerRun ' +
        'in the daemon config lifts it)'), { name: 'WorkflowAgentCapError' });
    }
    if (v.target !== null && v.target !== undefined && v.outputTokens >= v.target) {
      throw Object.assign(new Error('agent(): the run\'s token target is spent (' + v.outputTokens + ' of ' + v.target +
        ' output tokens; the run\'s tokenTarget lifts it)'), { name: 'WorkflowBudgetExceededError' });
    }
  };
  const asNull = (results, what) => results.map((r, i) => {
    if (r.status === 'fulfilled') return r.value === undefined ? null : r.value;
    if (nameOf(r.reason) !== 'WorkflowBudgetExceededError') log(what + '[' + i + '] failed: ' + messageOf(r.reason));
    return null;
  });

  async function parallel(thunks) {
    if (!Array.isArray(thunks)) throw new TypeError('parallel() expects an array of functions');
    if (thunks.length === 0) return [];
    fatalNow();
    thunks.forEach((f) => {
      if (typeof f !== 'function') throw new TypeError('parallel() expects an array of functions, not promises. Wrap each call: () => agent(...)');
    });
    const b = current;
    const results = await Promise.allSettled(thunks.map((t) => Promise.resolve().then(() => inBranch(b, t))));
    return asNull(results, 'parallel');
  }
  async function pipeline(items, ...stages) {
    if (!Array.isArray(items)) throw new TypeError('pipeline() expects an array as the first argument');
    if (items.length === 0) return [];
    fatalNow();
    stages.forEach((s) => {
      if (typeof s !== 'function') throw new TypeError('pipeline() stages must be functions: pipeline(items, item => ..., result => ...)');
    });
    // Each item runs through the stages on its own chain (no barrier between stages):
    // stage k of an item starts as soon as stage k-1 of that item is done. A stage gets
    // (previous result, original item, index); the first stage's previous result is the
    // item. A null result skips the item's remaining stages.
    const b = current;
    const run = async (item, index) => {
      let v = item;
      for (const stage of stages) {
        if (v === null) break;          // as Claude Code: only null ends an item early
        v = await inBranch(b, () => stage(v, item, index));
      }
      return v;
    };
    const results = await Promise.allSettled(items.map((item, i) => Promise.resolve().then(() => run(item, i))));
    return asNull(results, 'pipeline');
  }

  // race: the first value that is not null wins; the other branches are cancelled.
  function race(thunks) {
    try { checkFunctions(thunks, 'race(thunks)', 'thunks'); } catch (e) { return Promise.reject(e); }
    const parent = current;
    return new Promise((resolve, reject) => {
      if (thunks.length === 0) { resolve(null); return; }
      const results = new Array(thunks.length);
      const branches = [];
      let left = thunks.length, decided = false;
      thunks.forEach((t, i) => branches.push(spawnBranch(parent, t, (ok, v) => {
        left--;
        results[i] = settled(ok, v);
        if (decided) return;
        if (ok && isValue(v)) {
          decided = true;
          cancelBranches(branches.filter((_, j) => j !== i), 'lost the race');
          resolve(v);
        } else if (left === 0) {
          decided = true;
          const err = firstFailure(results, 'race', ', none won');
          if (err) reject(err); else resolve(null);
        }
      })));
    });
  }

  // waitN: the first n values that are not null, in completion order; the rest are
  // cancelled. Throws as soon as fewer than n can succeed.
  function waitN(n, thunks) {
    try {
      checkFunctions(thunks, 'waitN(n, thunks)', 'thunks');
      if (!Number.isInteger(n) || n < 0) throw new TypeError('waitN(n, thunks): n must be a non-negative integer');
    } catch (e) { return Promise.reject(e); }
    if (n === 0) return Promise.resolve([]);
    if (n > thunks.length) {
      return Promise.reject(new Error('waitN(' + n + ', thunks): only ' + thunks.length + ' thunks, so ' + n + ' can never succeed'));
    }
    const parent = current;
    return new Promise((resolve, reject) => {
      const values = [], winners = new Set(), branches = [];
      let failed = 0, firstError = null, decided = false;
      const giveUp = () => {
        decided = true;
        const running = thunks.length - values.length - failed;
        cancelBranches(branches.filter((_, j) => !winners.has(j)), 'waitN could not succeed');
        const e = new Error('waitN(' + n + '): only ' + values.length + ' of ' + thunks.length + ' succeeded, ' +
          n + ' needed (' + failed + ' failed or returned null' +
          (running ? ', ' + running + ' still running were cancelled' : '') + ')' +
          (firstError ? '; first error: ' + String(firstError && firstError.message || firstError) : ''));
        e.values = values.slice();
        reject(e);
      };
      thunks.forEach((t, i) => branches.push(spawnBranch(parent, t, (ok, v) => {
        if (decided) return;
        if (ok && isValue(v)) {
          values.push(v);
          winners.add(i);
          if (values.length === n) {
            decided = true;
            cancelBranches(branches.filter((_, j) => !winners.has(j)), 'waitN had its ' + n + ' results');
            resolve(values.slice());
          }
          return;
        }
        failed++;
        if (!ok && firstError === null) firstError = v;
        if (thunks.length - failed < n) giveUp();
      })));
    });
  }

  // bounded: fn(item, index) over items with at most limit in flight, results in input
  // order. After a failure no new item starts; the started ones settle, then the first
  // failure in input order is thrown.
  function bounded(limit, items, fn) {
    try {
      if (!Number.isInteger(limit) || limit < 1) throw new TypeError('bounded(limit, items, fn): limit must be a positive integer');
      if (!Array.isArray(items)) throw new TypeError('bounded(limit, items, fn): items must be an array');
      if (typeof fn !== 'function') throw new TypeError('bounded(limit, items, fn): fn must be a function');
    } catch (e) { return Promise.reject(e); }
    const b = current;
    return new Promise((resolve, reject) => {
      const results = new Array(items.length);
      let next = 0, running = 0, stopped = false;
      const finishIfDone = () => {
        if (running > 0 || (next < items.length && !stopped)) return;
        const notStarted = items.length - next;
        const err = firstFailure(results, 'bounded', notStarted ? ', ' + notStarted + ' not started' : '');
        if (err) reject(err); else resolve(results.map((r) => r.value));
      };
      const launch = () => {
        while (!stopped && running < limit && next < items.length) {
          const i = next++;
          running++;
          startIn(b, () => fn(items[i], i)).then(
            (v) => { results[i] = settled(true, v); },
            (e) => { results[i] = settled(false, e); stopped = true; },
          ).then(() => { running--; launch(); finishIfDone(); });
        }
      };
      launch();
      finishIfDone();
    });
  }

  // The script's budget, Claude Code's shape first: budget.total is the run's token target
  // (null without one), budget.spent() the output tokens the run's agents used so far,
  // budget.remaining() what is left of the target (Infinity without one). SwarmBase's USD
  // view is budget.usd, the codex token budget budget.codex. Refreshed with every answer.
  let budgetView = { usd: { total: 0, spent: 0, reserved: 0, remaining: 0 }, codex: null, target: null, outputTokens: 0 };
  const ledgerView = (get) => Object.freeze(Object.create(null, {
    total: { get: () => get().total, enumerable: true },
    spent: { get: () => get().spent, enumerable: true },
    reserved: { get: () => get().reserved, enumerable: true },
    remaining: { get: () => get().remaining, enumerable: true },
  }));
  const usdView = ledgerView(() => budgetView.usd);
  const codexView = ledgerView(() => budgetView.codex || { total: 0, spent: 0, reserved: 0, remaining: 0 });
  const budget = Object.freeze(Object.create(null, {
    total: { get: () => (budgetView.target === undefined ? null : budgetView.target), enumerable: true },
    spent: { value: function spent() { return budgetView.outputTokens || 0; }, enumerable: false },
    remaining: { value: function remaining() {
      const t = budgetView.target;
      return t === null || t === undefined ? Infinity : Math.max(0, t - (budgetView.outputTokens || 0));
    }, enumerable: false },
    usd: { value: usdView, enumerable: true },
    codex: { get: () => (budgetView.codex ? codexView : null), enumerable: true },
    toJSON: { value: () => ({ total: budgetView.target === undefined ? null : budgetView.target }) },
  }));

  def('agent', agent);
  def('workflow', workflow);
  def('parallel', parallel);
  def('pipeline', pipeline);
  def('race', race);
  def('waitN', waitN);
  def('bounded', bounded);
  def('phase', phase);
  def('log', log);
  def('budget', budget);
  def('console', Object.freeze({ log, info: log, debug: log, warn: logWith('[warn] '), error: logWith('[error] ') }));

  const fail = (e) => {
    noteAllocFailure(e);
    let message, line = null;
    if (e && typeof e === 'object') {
      message = (e.name ? e.name + ': ' : '') + e.message;
      const m = /script\.js:(\d+)/.exec(String(e.stack || ''));
      if (m) line = Number(m[1]);
    } else {
      message = 'the script threw a non-error value: ' + String(e);
    }
    send({ t: 'done', ok: false, error: message, line });
  };

  def('__sb', Object.freeze({
    start(body, argsValue, b) {
      budgetView = b;
      // Claude Code's args: the value verbatim (undefined when none was given), a plain
      // global the script may reassign or change.
      Object.defineProperty(globalThis, 'args', { value: argsValue, writable: true, enumerable: true, configurable: true });
      let result;
      try { result = body(); } catch (e) { fail(e); return; }
      Promise.resolve(result).then((value) => {
        let v;
        try { v = plain(value, 'the return value'); } catch (e) { fail(e); return; }
        send({ t: 'done', ok: true, value: v });
      }, fail);
    },
    recv(msg) {
      if (msg.t === 'budget') budgetView = msg.budget;
      else if (msg.t === 'reply') deliverReply(msg);
    },
    startNext,
    // A failed allocation ends the run whatever the script did with the error, so it
    // replaces everything else the slice sent.
    drain() {
      if (allocFailed()) return '{"t":"memory"}';
      const s = out.join('\n');
      out.length = 0;
      return s;
    },
    pendingCount() { return pending.size; },
  }));
`;
