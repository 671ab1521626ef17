// Source evaluated inside the script's vm context: the outbound message queue, bridge
// calls, and the branches that let race()/waitN() cancel the calls of their losers.
// Defines for the later parts: send, plain, def, call, current/inBranch, spawnBranch,
// cancelBranches, startNext, deliverReply, pending.
//
// Branch attribution (no async hooks, deterministic):
// - `current` is the branch the running script code belongs to; the root script is ROOT.
// - Every race()/waitN() thunk starts in its *own* evaluation (startNext, called by the
//   runner after each slice), with `current` set to its branch. With microtaskMode
//   'afterEvaluate' the queue is empty when an evaluation begins and drained when it ends,
//   so every continuation of that evaluation (even after `await null`) descends from the
//   thunk and is attributed to its branch.
// - A bridge call records its branch. Delivering its reply is again one evaluation, which
//   sets `current` to that branch before resolving, so the awaiting code's continuations
//   (and the calls they make) stay in the branch.
// - parallel/pipeline/bounded start their functions in the branch they were called from.
// - Cancelling a branch cancels the in-flight calls of it and its descendants; a branch
//   whose thunk has not settled is marked lost, and any later call in it or below it
//   resolves null at once without reaching the daemon. A settled branch is not marked
//   lost: nothing of it runs any more, but cancelling it would also hit code that
//   shares its promises.
// - When a branch's thunk settles, `current` goes back to the parent: what runs next in
//   that drain is the code that awaited it (race/waitN and their caller).
// - Limitation: code of one branch that awaits a promise made in another branch runs,
//   after that point, attributed to the other branch.
export const CALLS = String.raw`
  const out = [];
  const send = (msg) => { out.push(JSON.stringify(msg)); };
  // Every value a script hands the daemon passes here. The daemon refuses values nested
  // deeper than this (swarmbase/json_depth.py MAX_DEPTH, the same number), so it is
  // checked here too, where a catch can still handle it.
  const MAX_DEPTH = 100;
  const tooDeep = (v) => {
    const stack = [[v, 1]];
    while (stack.length) {
      const [c, d] = stack.pop();
      if (d > MAX_DEPTH) return true;
      for (const x of Array.isArray(c) ? c : Object.values(c)) {
        if (x !== null && typeof x === 'object') stack.push([x, d + 1]);
      }
    }
    return false;
  };
  const plain = (v, what) => {
    if (v === undefined) return null;
    let text;
    const deep = () => new TypeError(what + ': nested deeper than ' + MAX_DEPTH + ' levels (the limit)');
    try { text = JSON.stringify(v); } catch (e) {
      // Far too deep for V8's own stack: the same answer.
      if (e instanceof RangeError && /call stack/i.test(e.message)) throw deep();
      throw e;
    }
    if (text === undefined) throw new TypeError(what + ' must be JSON-serialisable');
    const value = JSON.parse(text);
    if (value !== null && typeof value === 'object' && tooDeep(value)) throw deep();
    return value;
  };
  const def = (name, value) => Object.defineProperty(globalThis, name,
    { value, writable: false, enumerable: false, configurable: false });

  const newBranch = (parent) => {
    const b = { parent, lost: false, settled: false, children: [], calls: new Set() };
    if (parent) parent.children.push(b);
    return b;
  };
  const ROOT = newBranch(null);
  let current = ROOT;
  const isLost = (b) => { for (let x = b; x; x = x.parent) if (x.lost) return true; return false; };
  const inBranch = (b, fn) => {
    const saved = current;
    current = b;
    try { return fn(); } finally { current = saved; }
  };
  // Start fn in branch b; a synchronous throw becomes a rejection.
  const startIn = (b, fn) => {
    try { return Promise.resolve(inBranch(b, fn)); } catch (e) { return Promise.reject(e); }
  };

  const pending = new Map();   // call id -> { resolve, reject, site, branch, cancelled }
  let nextId = 1;
  // The call site's stack is captured now, so a rejection points at the script line
  // that called the hook rather than at the bridge.
  const call = (op, payload) => {
    const branch = current;
    if (isLost(branch)) return Promise.resolve(null);
    const site = new Error();
    return new Promise((resolve, reject) => {
      const id = nextId++;
      pending.set(id, { resolve, reject, site, branch, cancelled: false });
      branch.calls.add(id);
      send(Object.assign({ t: 'call', id, op }, payload));
    });
  };

  const ERROR_NAMES = { budget: 'WorkflowBudgetExceededError', cap: 'WorkflowAgentCapError' };
  const deliverReply = (msg) => {
    const p = pending.get(msg.id);
    if (!p) return;
    pending.delete(msg.id);
    p.branch.calls.delete(msg.id);
    current = p.branch;
    if (msg.ok) { p.resolve(msg.value === undefined ? null : msg.value); return; }
    const err = new Error(msg.error);
    // A stop of the whole run's budget or agent cap carries Claude Code's error names, so
    // parallel()/pipeline() drop budget stops quietly and scripts can test e.name.
    const name = ERROR_NAMES[msg.kind];
    if (name) err.name = name;
    err.stack = err.name + ': ' + msg.error + '\n' + String(p.site.stack).split('\n').slice(1).join('\n');
    p.reject(err);
  };

  const cancelBranches = (losers, reason) => {
    const ids = [];
    const visit = (b) => {
      for (const id of b.calls) {
        const p = pending.get(id);
        if (p && !p.cancelled) { p.cancelled = true; ids.push(id); }
      }
      b.children.forEach(visit);
    };
    for (const b of losers) {
      if (!b.settled) b.lost = true;
      visit(b);
    }
    if (ids.length) send({ t: 'cancel', ids, reason });
  };

  // race()/waitN() thunks wait here until the runner starts each in its own evaluation.
  const starts = [];
  const spawnBranch = (parent, thunk, onSettle) => {
    const b = newBranch(parent);
    starts.push({ b, thunk, onSettle });
    return b;
  };
  const startNext = () => {
    const s = starts.shift();
    if (!s) return false;
    current = s.b;
    // What runs after a thunk's promise settles (in the same drain) is the code that
    // awaited it: race()/waitN() and their caller, so it belongs to the parent branch.
    const settle = (ok, v) => { s.b.settled = true; current = s.b.parent; s.onSettle(ok, v); };
    // A branch whose race was decided before it started never runs.
    let p;
    if (isLost(s.b)) p = Promise.resolve(null);
    else try { p = Promise.resolve(s.thunk()); } catch (e) { p = Promise.reject(e); }
    p.then((v) => settle(true, v), (e) => settle(false, e));
    return true;
  };
`;
