// eventsource-follow.mjs — reads a belay event stream with the npm
// `eventsource` package, a standard EventSource, the way a browser page
// would. Run by TestEventSourceStopsAfterFinishedRun (events_node_test.go).
//
//   node eventsource-follow.mjs CONFIG_JSON
//
// CONFIG_JSON: {"token": "...", "types": ["run.queued", ...], "linger": ms,
//               "clients": [{"name": "start", "url": "http://..."}, ...]}
//
// Each client opens its URL with the control-plane token, records every
// event it is given (id, type, data), and waits for the EventSource to close
// itself: that happens only when the server answers 204 No Content. It then
// lingers, so that a reconnect the library should not make would still reach
// the server, and prints one JSON line per client. A client that has not
// closed within the deadline prints closed: false.
import { EventSource } from "eventsource";

const cfg = JSON.parse(process.argv[2]);
const deadlineMs = 30000;

function follow(client) {
	return new Promise((resolve) => {
		const events = [];
		const errors = [];
		const started = Date.now();
		const es = new EventSource(client.url, {
			fetch: (input, init) =>
				fetch(input, { ...init, headers: { ...init.headers, Authorization: `Bearer ${cfg.token}` } }),
		});
		const record = (ev) => events.push({ id: ev.lastEventId, type: ev.type, data: ev.data });
		for (const t of cfg.types) es.addEventListener(t, record);
		es.addEventListener("message", record);
		let done = false;
		const finish = (closed) => {
			if (done) return;
			done = true;
			clearTimeout(timer);
			const closedAfterMs = Date.now() - started;
			// Linger with the EventSource closed: a reconnect it should not
			// make would show in the server's count of requests.
			setTimeout(() => {
				es.close();
				resolve({ name: client.name, closed, closedAfterMs, events, errors });
			}, closed ? cfg.linger : 0);
		};
		es.addEventListener("error", (ev) => {
			errors.push({ code: ev.code ?? null, message: ev.message ?? "" });
			if (es.readyState === es.CLOSED) finish(true);
		});
		const timer = setTimeout(() => finish(false), deadlineMs);
	});
}

const results = await Promise.all(cfg.clients.map(follow));
for (const r of results) console.log(JSON.stringify(r));
