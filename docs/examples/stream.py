"""Stream a German sentence to a simulserve server; print each English word as it is written."""
import asyncio, json, sys
from websockets.asyncio.client import connect  # pip install websockets

URL = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8000/v1/stream"
TEXT = sys.argv[2] if len(sys.argv) > 2 else "Klicken Sie auf Speichern, um das Dokument zu speichern."

async def speak(ws, words):
    for word in words:  # one word at a time, at a speaker's pace
        await ws.send(json.dumps({"type": "words", "words": [word]}))
        await asyncio.sleep(0.3)
    await ws.send(json.dumps({"type": "end_stream"}))  # ends the sentence; the server closes once done

async def main():
    async with connect(URL) as ws:
        await ws.send(json.dumps({"type": "start"}))  # the server's first model; or "model": "waitk", "k": 3
        speaker = asyncio.create_task(speak(ws, TEXT.split()))
        while (msg := json.loads(await ws.recv()))["type"] != "end":  # the server closes after "end"
            if msg["type"] == "word": print(msg["text"], f"(after {msg['delay']} source words)", flush=True)
            if msg["type"] == "error": sys.exit(f"error: {msg['code']}: {msg['message']}")
        await speaker

asyncio.run(main())
