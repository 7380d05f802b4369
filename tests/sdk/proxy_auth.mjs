// The official MCP TypeScript SDK, as a team's agents would use it, through `replay-guard proxy`
// with client authentication, to an MCP server of the SDK's own whose deploy tool counts its
// side effects (the ground truth). Usage: node proxy_auth.mjs REPLAY_GUARD_BINARY WORK_DIR
//
// 1. Two API-key principals send the same deploy: two executions, two effects.
// 2. A JWT principal's response is lost after the effect; it refreshes its token (new exp and
//    jti, same sub) and repeats: the same actor, so the call stays held: one effect.
// 3. A wrong key, an expired JWT, a JWT signed by another key, a JWT for another audience:
//    401 each, no request reaches the server, no execution begins in the ledger.
// Exits 0 when every check holds, 1 (naming the check) otherwise.

import { spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import readline from "node:readline";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const [binary, work] = process.argv.slice(2);
const ISSUER = "https://id.example.test";
const AUDIENCE = "replay-guard-proxy";
const KEYS = { alice: "k-alice-sdk-9f2d41", bob: "k-bob-sdk-7c03e8" };

let failures = 0;
function check(ok, what) {
    console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
    if (!ok) failures += 1;
}

// --- The server: the SDK's own, stateless, its deploy tool counting its effects. -----------
let effects = 0;
let requests = 0;
let dropNext = false;
let current = null;
const server = http.createServer(async (req, res) => {
    requests += 1;
    current = req;
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const mcp = new McpServer({ name: "deploy-server", version: "1.0.0" });
    mcp.registerTool(
        "deploy_release",
        {
            description: "Deploys a release (irreversible).",
            inputSchema: { service: z.string(), version: z.string() },
            annotations: { destructiveHint: true, idempotentHint: false },
        },
        async ({ service, version }) => {
            effects += 1;
            if (dropNext) {
                // The effect happened; the answer is lost on the way back.
                dropNext = false;
                req.socket.destroy();
            }
            return { content: [{ type: "text", text: `deployed ${service} ${version} (#${effects})` }] };
        },
    );
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on("close", () => transport.close());
    await mcp.connect(transport);
    await transport.handleRequest(req, res, body);
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const upstream = `http://127.0.0.1:${server.address().port}/mcp`;

// --- Credentials: API keys (their SHA-256 only), a JWK set of an ES256 key. ------------------
const sha256 = (text) => crypto.createHash("sha256").update(text).digest("hex");
fs.writeFileSync(
    path.join(work, "clients.toml"),
    Object.entries(KEYS)
        .map(([name, key]) => `[[client]]\nprincipal = "${name}"\nkey_sha256 = "${sha256(key)}"\n`)
        .join("\n"),
);
const signer = crypto.generateKeyPairSync("ec", { namedCurve: "P-256" });
const stranger = crypto.generateKeyPairSync("ec", { namedCurve: "P-256" });
const jwk = { ...signer.publicKey.export({ format: "jwk" }), alg: "ES256", use: "sig", kid: "k1" };
fs.writeFileSync(path.join(work, "jwks.json"), JSON.stringify({ keys: [jwk] }));
const b64 = (value) => Buffer.from(typeof value === "string" ? value : JSON.stringify(value)).toString("base64url");
function jwt(keys, sub, { audience = AUDIENCE, expiresIn = 600 } = {}) {
    const now = Math.floor(Date.now() / 1000);
    const head = b64({ alg: "ES256", typ: "JWT", kid: "k1" });
    const claims = b64({ iss: ISSUER, sub, aud: audience, iat: now, exp: now + expiresIn, jti: crypto.randomUUID() });
    const signature = crypto.sign("sha256", Buffer.from(`${head}.${claims}`), {
        key: keys.privateKey,
        dsaEncoding: "ieee-p1363",
    });
    return `${head}.${claims}.${signature.toString("base64url")}`;
}

// --- The proxy, the built binary. -----------------------------------------------------------
const ledger = path.join(work, "ledger.jsonl");
const proxy = spawn(
    binary,
    [
        "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream, "--ledger", ledger,
        "--clients", path.join(work, "clients.toml"),
        "--jwt-jwks", path.join(work, "jwks.json"), "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE,
    ],
    { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: "trace" } },
);
let log = "";
proxy.stderr.on("data", (chunk) => (log += chunk));
const listening = await new Promise((resolve, reject) => {
    const lines = readline.createInterface({ input: proxy.stdout });
    lines.once("line", resolve);
    setTimeout(() => reject(new Error("the proxy did not say where it listens")), 20000);
});
const proxyUrl = `${listening.split(/\s+/)[2]}/mcp`;

/// Calls deploy_release through the proxy as the SDK's client with `headers`: the result, or
/// the error the SDK threw.
async function deploy(headers) {
    const client = new Client({ name: "sdk-agent", version: "1.0.0" });
    const transport = new StreamableHTTPClientTransport(new URL(proxyUrl), { requestInit: { headers } });
    try {
        await client.connect(transport);
        return await client.callTool({ name: "deploy_release", arguments: { service: "catalog", version: "2026.07.22" } });
    } catch (error) {
        return { error };
    } finally {
        await client.close().catch(() => {});
    }
}
// Executions begun: a refused request begins none (a delivery of an earlier call may still be
// written meanwhile).
const ledgerLines = () =>
    fs.existsSync(ledger) ? fs.readFileSync(ledger, "utf8").split("\n").filter((line) => line.includes('"accepted"')).length : 0;
const text = (result) => JSON.stringify(result?.content ?? result?.error?.message ?? result);

try {
    // 1. Two API-key principals: two executions.
    const alice = await deploy({ "X-API-Key": KEYS.alice });
    const bob = await deploy({ Authorization: `Bearer ${KEYS.bob}` });
    check(!alice.error && !alice.isError && !bob.error && !bob.isError, `both principals' deploys answered: ${text(alice)} ${text(bob)}`);
    check(effects === 2, `two API-key principals are two executions (effects: ${effects})`);

    // 2. A lost response, a refreshed token, the repeat held.
    dropNext = true;
    const lost = await deploy({ Authorization: `Bearer ${jwt(signer, "carol")}` });
    check(effects === 3, `carol's deploy ran once before its answer was lost (effects: ${effects}): ${text(lost)}`);
    const repeat = await deploy({ Authorization: `Bearer ${jwt(signer, "carol", { expiresIn: 900 })}` });
    check(effects === 3, `carol's repeat with a refreshed token ran nothing (effects: ${effects})`);
    check(!repeat.error && repeat.isError === true, `the repeat is answered honestly, held: ${text(repeat)}`);

    // 3. Refused: 401, nothing upstream, nothing in the ledger.
    const [upstreamBefore, linesBefore] = [requests, ledgerLines()];
    const refused = {
        "a wrong key": { "X-API-Key": "k-mallory-000" },
        "an expired JWT": { Authorization: `Bearer ${jwt(signer, "carol", { expiresIn: -3600 })}` },
        "a JWT signed by another key": { Authorization: `Bearer ${jwt(stranger, "carol")}` },
        "a JWT for another audience": { Authorization: `Bearer ${jwt(signer, "carol", { audience: "another" })}` },
        "no credential": {},
    };
    for (const [what, headers] of Object.entries(refused)) {
        const result = await deploy(headers);
        const message = String(result.error?.message ?? "");
        check(result.error?.code === 401, `${what}: refused with 401 (${result.error?.code}: ${message.slice(0, 100)})`);
    }
    check(requests === upstreamBefore, `no refused request reached the server (${requests - upstreamBefore} did)`);
    check(ledgerLines() === linesBefore, `no refused request began an execution in the ledger (${ledgerLines() - linesBefore} did)`);
    const ledgerText = fs.readFileSync(ledger, "utf8");
    for (const secret of [...Object.values(KEYS), "k-mallory-000"]) {
        check(!ledgerText.includes(secret) && !log.includes(secret), `the key ${secret.slice(0, 8)}… is in neither the ledger nor the trace log`);
    }
    check(ledgerText.includes(`principal:${ISSUER}#carol`), "carol's executions are recorded under her principal");
} finally {
    proxy.kill();
    server.close();
}
console.log(failures === 0 ? "all checks hold" : `${failures} checks failed`);
process.exit(failures === 0 ? 0 : 1);
