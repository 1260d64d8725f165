# quickstart.py: two tasks and an enqueue. Run it with
#   pgjobs migrate && python quickstart.py && pgjobs work --burst
# (pyproject.toml names the app; tests/integration/docs/test_doc_snippets.py runs the last two).
import pgjobs

app = pgjobs.App()  # the database: found as the pgjobs commands find it (see Configuration)


@app.task(name="emails.welcome", queue="emails", max_attempts=5, retry_base=2, retry_cap=600)
def send_welcome(user_id: int, template: str = "default") -> None:
    # the JSON payload's keys arrive as keyword arguments
    print(f"welcome e-mail to user {user_id} ({template})")


@app.task(name="images.resize", queue="images", lease=900)
async def resize(image_id: int) -> dict[str, int]:
    # async handlers run on the worker's event loop; sync ones in threads
    return {"width": 640}  # a JSON-able return value is stored in archived_jobs.result


if __name__ == "__main__":
    job_id = app.enqueue("emails.welcome", {"user_id": 42})
    app.enqueue(resize, {"image_id": 7})  # the task itself works as well as its name
    print(f"enqueued job {job_id} and one more")
