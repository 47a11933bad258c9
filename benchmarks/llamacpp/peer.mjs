// llama.cpp on the same GGUF and the same token ids as edgesplit: greedy generation (TTFT and
// decode tokens/s per run) or teacher forcing (the top-1 next token at every position).
// Usage: node peer.mjs REQUEST.json   (prints one JSON line)
// REQUEST: {"model": path, "threads": n, "mode": "generate"|"teacher", "tokens": [ids],
//           "new_tokens": n, "runs": n, "warmup": n, "context": n, "kv_type": "F32" (default F16)}
import {readFileSync} from "node:fs";
import {getLlama} from "node-llama-cpp";

const req = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: req.model});
const kv = req.kv_type ? {experimentalKvCacheKeyType: req.kv_type,
                          experimentalKvCacheValueType: req.kv_type} : {};
const context = await model.createContext({threads: req.threads, contextSize: req.context ?? 512,
                                           batchSize: req.context ?? 512, ...kv});
const sequence = context.getSequence();

async function generate() {
    await sequence.clearHistory();
    const start = performance.now();
    let first = null;
    const out = [];
    for await (const token of sequence.evaluate(req.tokens, {temperature: 0})) {
        if (first === null) first = performance.now();
        out.push(token);
        if (out.length >= req.new_tokens) break;
    }
    const end = performance.now();
    return {ttft_ms: first - start, decode_s: (end - first) / 1e3, tokens: out,
            decode_tokens_per_s: (out.length - 1) / ((end - first) / 1e3)};
}

async function teacher() {
    // feed the text's own next token at every step; record what llama.cpp would have picked
    await sequence.clearHistory();
    const picks = [];
    const it = sequence.evaluate(req.tokens.slice(0, 1), {temperature: 0});
    let r = await it.next();
    for (let i = 1; i < req.tokens.length && !r.done; i++) {
        picks.push(r.value);
        r = await it.next(req.tokens[i]);
    }
    if (!r.done) picks.push(r.value);
    await it.return();
    return {picks};
}

const result = {engine: "llama.cpp", binding: "node-llama-cpp 3.21.1", threads: req.threads};
if (req.mode === "teacher") {
    Object.assign(result, await teacher());
} else {
    for (let i = 0; i < (req.warmup ?? 1); i++) await generate();
    result.runs = [];
    for (let i = 0; i < (req.runs ?? 5); i++) result.runs.push(await generate());
}
result.peak_rss_mib = process.resourceUsage().maxRSS / 1024;  // kilobytes
process.stdout.write(JSON.stringify(result) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
