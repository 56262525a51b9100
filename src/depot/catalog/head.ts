/**
 * The change-sequence head the catalog's ETag, 304 and `since` answers are made from,
 * held in memory so that those answers read nothing from the store.
 * Why: docs/decisions/depot-catalog.md, "head.ts: how current the held head is".
 */
import { changeHead, knownHead, noteHead, positionOfKey } from "./changes.js";
import type { PackageStore } from "../ports.js";

/** How old (ms) the held head may grow on a store without `watchRecords` before a request waits for a probe. */
export const HEAD_STALE_MS = 1000;

interface HeadState {
  /** When the last finished probe started (ms, by the router's clock). */
  probedAt: number;
  probing?: Promise<number>;
  /** With a watch: bumped by every "look again"; a probe started in the current epoch makes the head live. */
  epoch: number;
  /** With a watch: true from a probe after the last "look again" until the next one. */
  live: boolean;
  watched: boolean;
}

const states = new WeakMap<PackageStore, HeadState>();

function stateOf(store: PackageStore): HeadState {
  let state = states.get(store);
  if (state) return state;
  state = { probedAt: Number.NEGATIVE_INFINITY, epoch: 0, live: false, watched: false };
  states.set(store, state);
  if (store.watchRecords) {
    const held = state;
    held.watched = true;
    // One subscription per store for the life of the process (a router has no close of its own).
    store.watchRecords((key) => {
      if (key === null) {
        held.epoch++;
        held.live = false;
        return;
      }
      const position = positionOfKey(key);
      if (position !== null) noteHead(store, position);
    });
  }
  return state;
}

function probe(store: PackageStore, state: HeadState, nowMs: number): Promise<number> {
  if (state.probing) return state.probing;
  const epoch = state.epoch;
  const probing = changeHead(store)
    .then((head) => {
      state.probedAt = nowMs;
      if (state.watched && state.epoch === epoch) state.live = true;
      return head;
    })
    .finally(() => {
      if (state.probing === probing) state.probing = undefined;
    });
  state.probing = probing;
  return probing;
}

/**
 * The sequence head for a catalog answer, from memory when it is current enough (see the
 * module comment); `atLeast`: a position the client already knows of, which forces a
 * probe when the held head is behind it. O(1) without a probe; a probe is one read when
 * nothing changed.
 *
 * @example
 * const head = await catalogHead(store, () => new Date());
 * const etag = catalogEtag(storeId, head);
 */
export async function catalogHead(store: PackageStore, now: () => Date, atLeast = 0): Promise<number> {
  const state = stateOf(store);
  const held = knownHead(store);
  const nowMs = now().getTime();
  if (atLeast > held) return probe(store, state, nowMs);
  if (state.watched) return state.live ? held : probe(store, state, nowMs);
  const age = nowMs - state.probedAt;
  if (age >= HEAD_STALE_MS || age < 0) return probe(store, state, nowMs);
  if (age >= HEAD_STALE_MS / 2) void probe(store, state, nowMs).catch(() => undefined);
  return held;
}
