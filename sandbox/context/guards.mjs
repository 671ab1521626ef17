// Source evaluated inside the script's vm context (see ../runner.mjs for how the parts
// are joined into one strict IIFE). This part closes the routes to the clock, to
// randomness and to GC timing, and notices failed memory allocations the script might
// catch. It defines `noteAllocFailure(e)` and `allocFailed()` for the other parts.
//
// Why each route is closed where it is:
// - Date: the global is a wrapper whose [[Prototype]] is Function.prototype, not the
//   real Date; `Date.prototype.constructor` points at the wrapper; the real Date's `now`
//   throws too, in case a route to it is ever found. Builtin stack frames do not expose
//   functions (checked with Error.prepareStackTrace), and the context has no other realm.
// - Intl.DateTimeFormat: `format()` and `formatToParts()` without a date format *now*.
//   They are patched on the real prototype, so every way of reaching a formatter is
//   covered; `formatRange*` already refuse a missing date.
// - Math.random: replaced, not writable. performance, crypto, timers: absent from vm
//   contexts (checked, and tested). WeakRef/FinalizationRegistry: GC timing differs
//   between runs, and cleanup callbacks would run outside any timed slice.
// - WebAssembly: code generation is off, but WebAssembly.Memory still allocates.
// - Memory: with RLIMIT_DATA a backing-store allocation throws RangeError "Array buffer
//   allocation failed" and the script could catch it and carry on. Every builtin that
//   allocates a backing store goes through a wrapper that notes the failure first, so
//   the runner ends the run however the script handles the error.
export const GUARDS = String.raw`
  const why = ' would differ when the run is resumed, so SwarmBase scripts may not use it. ' +
              'Pass times and seeds in args instead.';
  const refuse = (what) => { throw new Error(what + why); };
  const hide = (obj, key, value) => Object.defineProperty(obj, key,
    { value, writable: false, enumerable: false, configurable: false });

  const RealDate = Date;
  const SbDate = function (...a) {
    if (!new.target) refuse('Date() (the current time as text)');
    if (a.length === 0) refuse('new Date() without arguments (the current time)');
    return Reflect.construct(RealDate, a, new.target);
  };
  Object.defineProperty(SbDate, 'name', { value: 'Date' });
  Object.defineProperty(SbDate, 'length', { value: 7 });
  hide(SbDate, 'prototype', RealDate.prototype);
  hide(SbDate, 'UTC', RealDate.UTC);
  hide(SbDate, 'parse', RealDate.parse);
  const now = function now() { refuse('Date.now()'); };
  hide(SbDate, 'now', now);
  hide(RealDate, 'now', now);
  hide(RealDate.prototype, 'constructor', SbDate);
  hide(globalThis, 'Date', SbDate);

  hide(Math, 'random', function random() { refuse('Math.random()'); });

  const DTF = Intl.DateTimeFormat.prototype;
  const formatGetter = Object.getOwnPropertyDescriptor(DTF, 'format').get;
  const formatters = new WeakMap();
  Object.defineProperty(DTF, 'format', { configurable: false, enumerable: false, get() {
    const real = formatGetter.call(this);
    let f = formatters.get(real);
    if (!f) {
      f = (date) => (date === undefined ? refuse('Intl.DateTimeFormat().format() without a date (the current time)') : real(date));
      formatters.set(real, f);
    }
    return f;
  } });
  const realFormatToParts = DTF.formatToParts;
  hide(DTF, 'formatToParts', { formatToParts(date) {
    if (date === undefined) refuse('Intl.DateTimeFormat().formatToParts() without a date (the current time)');
    return Reflect.apply(realFormatToParts, this, [date]);
  } }.formatToParts);

  for (const name of ['WeakRef', 'FinalizationRegistry', 'WebAssembly']) delete globalThis[name];

  let allocFailedFlag = false;
  const RealRangeError = RangeError;
  const noteAllocFailure = (e) => {
    if (e instanceof RealRangeError && /allocation failed/i.test(String(e.message))) allocFailedFlag = true;
    return e;
  };
  const allocFailed = () => allocFailedFlag;
  const guardMethod = (obj, key) => {
    const real = obj[key];
    if (typeof real !== 'function') return;
    const wrapped = { [key](...a) {
      try { return Reflect.apply(real, this, a); } catch (e) { throw noteAllocFailure(e); }
    } }[key];
    Object.defineProperty(obj, key, { value: wrapped, writable: true, enumerable: false, configurable: true });
  };
  const guardConstructor = (name) => {
    const Real = globalThis[name];
    const Wrapped = function (...a) {
      if (!new.target) return Reflect.apply(Real, this, a);  // throws "requires 'new'"
      try { return Reflect.construct(Real, a, new.target); } catch (e) { throw noteAllocFailure(e); }
    };
    Object.setPrototypeOf(Wrapped, Object.getPrototypeOf(Real));
    for (const key of Reflect.ownKeys(Real)) {
      if (key === 'prototype' || key === 'name' || key === 'length') continue;
      Object.defineProperty(Wrapped, key, Object.getOwnPropertyDescriptor(Real, key));
    }
    Object.defineProperty(Wrapped, 'name', { value: name });
    Object.defineProperty(Wrapped, 'length', { value: Real.length });
    hide(Wrapped, 'prototype', Real.prototype);
    Object.defineProperty(Real.prototype, 'constructor', { value: Wrapped, writable: true, configurable: true });
    Object.defineProperty(globalThis, name, { value: Wrapped, writable: true, configurable: true });
  };
  const TYPED = ['Int8Array', 'Uint8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array', 'Int32Array',
                 'Uint32Array', 'Float32Array', 'Float64Array', 'BigInt64Array', 'BigUint64Array'];
  const TypedArrayProto = Object.getPrototypeOf(Uint8Array.prototype);
  for (const key of ['slice', 'map', 'filter', 'toReversed', 'toSorted', 'with']) guardMethod(TypedArrayProto, key);
  for (const key of ['from', 'of']) guardMethod(Object.getPrototypeOf(Uint8Array), key);
  for (const key of ['slice', 'resize', 'transfer', 'transferToFixedLength']) guardMethod(ArrayBuffer.prototype, key);
  for (const key of ['slice', 'grow']) guardMethod(SharedArrayBuffer.prototype, key);
  for (const name of ['ArrayBuffer', 'SharedArrayBuffer', ...TYPED]) guardConstructor(name);
`;
