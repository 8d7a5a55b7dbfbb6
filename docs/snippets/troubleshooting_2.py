# generated from docs/troubleshooting.md by docs/snippets/extract.py; edit the page, not this file
import fsdp2

try:
    fsdp2.FSDP2Strategy(data_paralel_size=2)  # a misspelt option
    raise SystemExit("expected InvalidArgumentError")
except fsdp2.InvalidArgumentError as e:
    assert isinstance(e, ValueError) and e.status == "FSDP2_ERROR_INVALID_ARGUMENT"
    print(e.message)

with fsdp2.FSDP2Strategy(precision="fp32") as s:
    try:
        s.parallelize()  # before setup_environment()
        raise SystemExit("expected WrongOrderError")
    except fsdp2.WrongOrderError as e:
        assert "setup_environment" in e.message, e.message
        print(e)
